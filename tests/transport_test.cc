// The transport contract, run for each UCX transport: tcp, shared memory and
// self (a context connected to itself).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "tests/test_util.h"
#include "transport/transport.h"

namespace tessera::transport {
namespace {

using namespace std::chrono_literals;
using tessera::testing::Waiter;

constexpr uint16_t kEchoMsg = 7;
constexpr uint16_t kDescribeMsg = 8;
constexpr uint16_t kSerialMsg = 9;

// Set on the threads of the Drive test that drive a context themselves.
thread_local bool tls_is_driver = false;

struct TransportCase {
  const char* name;
  const char* ucx_tls;
  bool loopback_self;           // connect a context to its own listener
  const char* expect_rma_lane;  // what UCX must have chosen for put/get
};

class TransportTest : public ::testing::TestWithParam<TransportCase> {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", GetParam().ucx_tls, 1);
    ContextOptions opts;
    opts.name = "server";
    auto server = Context::Open(opts);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    if (GetParam().loopback_self) {
      client_ctx_ = server_.get();
    } else {
      opts.name = "client";
      auto client = Context::Open(opts);
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      client_owned_ = std::move(*client);
      client_ctx_ = client_owned_.get();
    }

    auto region = server_->Allocate(kRegionSize, MemoryKind::kHost);
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    server_region_ = std::move(*region);

    // The server echoes messages and answers kDescribeMsg with its region's key.
    server_->SetHandler(
        kEchoMsg, [](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t> bytes) {
          from->Send(kEchoMsg + 100, std::vector<uint8_t>(bytes.begin(), bytes.end()));
        });
    server_->SetHandler(kDescribeMsg,
                        [this](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t>) {
                          from->Send(kDescribeMsg + 100, server_region_->Describe());
                        });
    client_ctx_->SetHandler(
        kEchoMsg + 100, [this](const std::shared_ptr<Endpoint>&, std::span<const uint8_t> bytes) {
          std::lock_guard<std::mutex> lock(mu_);
          replies_.emplace_back(bytes.begin(), bytes.end());
          cv_.notify_all();
        });
    // Counts its runs, where they ran, and any two that overlapped.
    server_->SetHandler(
        kSerialMsg, [](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t> bytes) {
          from->Send(kSerialMsg + 100, std::vector<uint8_t>(bytes.begin(), bytes.end()));
        });
    client_ctx_->SetHandler(kSerialMsg + 100,
                            [this](const std::shared_ptr<Endpoint>&, std::span<const uint8_t>) {
                              if (inside_.fetch_add(1) != 0) overlaps_++;
                              if (!client_ctx_->InProgressThread()) outside_progress_++;
                              if (tls_is_driver) ran_on_drivers_++;
                              // Long enough for another thread to collide.
                              const auto until = std::chrono::steady_clock::now() + 2us;
                              while (std::chrono::steady_clock::now() < until) {
                              }
                              inside_.fetch_sub(1);
                              serial_replies_++;
                            });
    client_ctx_->SetHandler(kDescribeMsg + 100, [this](const std::shared_ptr<Endpoint>&,
                                                       std::span<const uint8_t> bytes) {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.emplace_back(bytes.begin(), bytes.end());
      cv_.notify_all();
    });

    auto listener = server_->Listen("127.0.0.1", 0, [](const std::shared_ptr<Endpoint>&) {});
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(*listener);

    Waiter<Result<std::shared_ptr<Endpoint>>> connected;
    client_ctx_->Connect("127.0.0.1", listener_->port(), 10s, connected.callback());
    auto ep = connected.Wait();
    ASSERT_TRUE(ep.has_value()) << "connect did not call back";
    ASSERT_TRUE(ep->ok()) << ep->status().ToString();
    ep_ = std::move(ep->value());

    ep_->Send(kDescribeMsg, {});
    auto desc = NextReply();
    ASSERT_FALSE(desc.empty());
    auto remote = ep_->Attach(desc);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    remote_ = std::move(*remote);
  }

  void TearDown() override {
    remote_.reset();
    if (ep_) ep_->Close();
    ep_.reset();
    listener_.reset();
    // Contexts first: a progress thread may still be writing a late put into
    // the region (over tcp the target's thread does the write).
    client_owned_.reset();
    server_.reset();
    server_region_.reset();
  }

  std::vector<uint8_t> NextReply() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, 20s, [&] { return !replies_.empty(); })) return {};
    auto out = std::move(replies_.front());
    replies_.erase(replies_.begin());
    return out;
  }

  Status Wait(std::function<void(Completion)> op) {
    Waiter<Status> w;
    op(w.callback());
    auto st = w.Wait();
    return st ? *st : Status::DeadlineExceeded("operation did not complete in 30 s");
  }

  static constexpr size_t kRegionSize = (64u << 20) + 64;
  std::unique_ptr<Context> server_;
  std::unique_ptr<Context> client_owned_;
  Context* client_ctx_ = nullptr;
  std::unique_ptr<Region> server_region_;
  std::unique_ptr<Listener> listener_;
  std::shared_ptr<Endpoint> ep_;
  std::unique_ptr<RemoteRegion> remote_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> replies_;
  std::atomic<int> inside_{0}, overlaps_{0}, outside_progress_{0}, ran_on_drivers_{0};
  std::atomic<int> serial_replies_{0};
};

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_P(TransportTest, UsesTheIntendedTransport) {
  std::string lanes = ep_->DescribeLanes();
  EXPECT_NE(lanes.find(GetParam().expect_rma_lane), std::string::npos) << lanes;
}

TEST_P(TransportTest, MessagesRoundTripByteExact) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65537}, size_t{1} << 20,
                      (size_t{8} << 20) + 3}) {
    auto msg = Pattern(size, static_cast<uint32_t>(size));
    ep_->Send(kEchoMsg, msg);
    auto reply = NextReply();
    ASSERT_EQ(reply.size(), size) << "echo of " << size << " bytes";
    EXPECT_TRUE(reply == msg) << "echo of " << size << " bytes differs";
  }
}

TEST_P(TransportTest, PutThenGetByteExactAtUnalignedOffsets) {
  const uint64_t base = remote_->base();
  for (size_t size :
       {size_t{1}, size_t{3}, size_t{4096}, size_t{65535}, size_t{1} << 20, size_t{64} << 20}) {
    for (size_t offset : {size_t{1}, size_t{13}}) {
      if (offset + size > kRegionSize) continue;
      auto src = Pattern(size + 5, static_cast<uint32_t>(size * 31 + offset));
      // Unaligned local addresses too.
      const uint8_t* local = src.data() + 3;
      ASSERT_TRUE(
          Wait([&](Completion c) { ep_->Put(local, size, *remote_, base + offset, c); }).ok());
      ASSERT_TRUE(Wait([&](Completion c) { ep_->Flush(c); }).ok());
      ASSERT_EQ(std::memcmp(static_cast<uint8_t*>(server_region_->data()) + offset, local, size), 0)
          << "put of " << size << " bytes at offset " << offset;

      std::vector<uint8_t> back(size + 7, 0xee);
      ASSERT_TRUE(Wait([&](Completion c) {
                    ep_->Get(back.data() + 5, size, *remote_, base + offset, c);
                  }).ok());
      ASSERT_EQ(std::memcmp(back.data() + 5, local, size), 0) << "get of " << size << " bytes";
      EXPECT_EQ(back[4], 0xee) << "get wrote before its buffer";
      EXPECT_EQ(back[5 + size], 0xee) << "get wrote past its buffer";
    }
  }
}

TEST_P(TransportTest, ThousandOutstandingOperations) {
  constexpr size_t kOps = 1000, kSize = 4099;
  auto src = Pattern(kOps * kSize, 99);
  std::atomic<size_t> done{0}, failed{0};
  std::promise<void> all;
  auto on_done = [&](Status st) {
    if (!st.ok()) failed++;
    if (++done == kOps) all.set_value();
  };
  for (size_t i = 0; i < kOps; ++i) {
    ep_->Put(src.data() + i * kSize, kSize, *remote_, remote_->base() + 1 + i * kSize, on_done);
  }
  ASSERT_EQ(all.get_future().wait_for(30s), std::future_status::ready) << done << " of " << kOps;
  EXPECT_EQ(failed, 0u);
  ASSERT_TRUE(Wait([&](Completion c) { ep_->Flush(c); }).ok());
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(server_region_->data()) + 1, src.data(), src.size()),
            0);

  std::vector<uint8_t> back(kOps * kSize);
  done = 0;
  std::promise<void> all_gets;
  for (size_t i = 0; i < kOps; ++i) {
    ep_->Get(back.data() + i * kSize, kSize, *remote_, remote_->base() + 1 + i * kSize,
             [&](Status st) {
               if (!st.ok()) failed++;
               if (++done == kOps) all_gets.set_value();
             });
  }
  ASSERT_EQ(all_gets.get_future().wait_for(30s), std::future_status::ready);
  EXPECT_EQ(failed, 0u);
  EXPECT_TRUE(back == src);
}

TEST_P(TransportTest, OutOfRegionAccessRefused) {
  std::vector<uint8_t> buf(16);
  Status st = Wait([&](Completion c) {
    ep_->Put(buf.data(), buf.size(), *remote_, remote_->base() + kRegionSize - 8, c);
  });
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  st = Wait([&](Completion c) { ep_->Get(buf.data(), 1, *remote_, remote_->base() - 1, c); });
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
}

TEST_P(TransportTest, BadRemoteKeyRefused) {
  auto desc = server_region_->Describe();
  for (size_t i : {size_t{0}, desc.size() / 2, desc.size() - 1}) {
    auto bad = desc;
    bad[i] ^= 0x5a;
    auto r = ep_->Attach(bad);
    EXPECT_FALSE(r.ok()) << "corrupted byte " << i << " accepted";
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("remote key"), std::string::npos);
    }
  }
  std::vector<uint8_t> garbage(200, 0x41);
  EXPECT_FALSE(ep_->Attach(garbage).ok());
  EXPECT_FALSE(ep_->Attach(std::span<const uint8_t>(desc.data(), 10)).ok());
  EXPECT_FALSE(ep_->Attach({}).ok());
}

TEST_P(TransportTest, ConnectToDeadAddressFailsWithinTimeout) {
  Waiter<Result<std::shared_ptr<Endpoint>>> w;
  auto start = std::chrono::steady_clock::now();
  client_ctx_->Connect("127.0.0.1", tessera::testing::UnusedPort(), 2s, w.callback());
  auto r = w.Wait(10s);
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.has_value()) << "connect to a dead address never called back";
  EXPECT_FALSE(r->ok());
  EXPECT_LT(elapsed, 4s) << "failure took longer than the 2 s timeout";
  EXPECT_NE(r->status().message().find("127.0.0.1"), std::string::npos) << r->status().ToString();
}

TEST_P(TransportTest, CountersSeparateMessagesFromOneSidedBytes) {
  auto before = client_ctx_->counters();
  std::vector<uint8_t> buf(1 << 20, 1);
  ASSERT_TRUE(Wait([&](Completion c) {
                ep_->Put(buf.data(), buf.size(), *remote_, remote_->base(), c);
              }).ok());
  ASSERT_TRUE(Wait([&](Completion c) { ep_->Flush(c); }).ok());
  auto after = client_ctx_->counters();
  EXPECT_EQ(after.put_bytes - before.put_bytes, buf.size());
  EXPECT_EQ(after.message_bytes_sent, before.message_bytes_sent);
}

// Threads that call Drive() take the progress thread's place one at a time:
// handlers run on them too, never two at once, and each sees itself as the
// progress thread.
TEST_P(TransportTest, DrivingThreadsRunHandlersOneAtATime) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> drivers;
  for (int i = 0; i < 2; ++i) {
    drivers.emplace_back([&] {
      tls_is_driver = true;
      while (!stop.load()) {
        if (!client_ctx_->Drive()) std::this_thread::yield();
      }
    });
  }
  // The progress thread may win every race for a while on a loaded machine:
  // keep sending until a driver has run a handler (or time is up).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  int sent = 0;
  while ((sent < 2000 || ran_on_drivers_.load() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 100; ++i, ++sent) ep_->Send(kSerialMsg, {1, 2, 3});
    while (serial_replies_.load() < sent && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
  }
  stop = true;
  for (auto& t : drivers) t.join();
  EXPECT_EQ(serial_replies_.load(), sent);
  EXPECT_EQ(overlaps_.load(), 0);
  EXPECT_EQ(outside_progress_.load(), 0);
  EXPECT_GT(ran_on_drivers_.load(), 0) << "no handler ran on a driving thread";
}

INSTANTIATE_TEST_SUITE_P(Ucx, TransportTest,
                         ::testing::Values(TransportCase{"tcp", "tcp", false, "tcp/"},
                                           TransportCase{"shm", "posix,sysv,cma,tcp", false,
                                                         "sysv/memory"},
                                           TransportCase{"self", "self,tcp", true, "self/"}),
                         [](const auto& test_info) { return std::string(test_info.param.name); });

}  // namespace
}  // namespace tessera::transport
