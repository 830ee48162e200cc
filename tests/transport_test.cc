// The transport contract, run for each UCX transport: tcp, shared memory and
// self (a context connected to itself).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

#include "core/log.h"
#include "tests/test_util.h"
#include "tests/transport_fixture.h"
#include "transport/region_desc.h"
#include "transport/sockaddr.h"
#include "transport/tcp/tcp_session_cipher.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_tcp_policy.h"

namespace tessera::transport {
namespace {

using namespace std::chrono_literals;
using tessera::testing::Waiter;
using tessera::testing::WaitUntil;

// Seeded bytes that differ at every offset, eight from each draw: a byte a
// draw cost the 64 MiB cases most of their time under TSan.
std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t word = rng();
    std::memcpy(v.data() + i, &word, std::min<size_t>(8, n - i));
  }
  return v;
}

TEST_P(TransportTest, UsesTheIntendedTransport) {
  std::string lanes = ep_->DescribeLanes();
  EXPECT_NE(lanes.find(GetParam().expect_rma_lane), std::string::npos) << lanes;
  EXPECT_TRUE(WaitUntil([&] { return ep_->session_protected() == GetParam().protect; }, 10s));
}

TEST_P(TransportTest, MessagesRoundTripByteExact) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65537}, size_t{1} << 20,
                      (size_t{8} << 20) + 3}) {
    auto msg = Pattern(size, static_cast<uint32_t>(size));
    ep_->SendCopy(kEchoMsg, msg);
    auto reply = NextReply();
    ASSERT_EQ(reply.size(), size) << "echo of " << size << " bytes";
    EXPECT_TRUE(reply == msg) << "echo of " << size << " bytes differs";
  }
}

// A peer that has not authenticated may announce only a small message: a
// larger one closes its connection before anything is allocated for it
// (UCX used to allocate whatever a rendezvous announced: 64 GiB killed a
// server with std::bad_alloc).
TEST_P(TransportTest, StrangersCannotAnnounceLargeMessages) {
  authenticate_accepted_ = false;
  auto connect = [&] {
    Waiter<Result<std::shared_ptr<Endpoint>>> connected;
    client_ctx_->Connect(host_, listener_->port(), 10s, connected.callback());
    auto ep = connected.Wait();
    EXPECT_TRUE(ep.has_value() && ep->ok());
    return ep.has_value() && ep->ok() ? ep->value() : nullptr;
  };
  auto small = connect();
  ASSERT_NE(small, nullptr);
  small->MarkAuthenticated();  // its replies may be anything; the server's side is the test
  auto msg = Pattern(1024, 5);
  small->SendCopy(kEchoMsg, msg);
  EXPECT_TRUE(NextReply() == msg) << "a small message from a stranger is fine";

  auto large = connect();
  ASSERT_NE(large, nullptr);
  large->SendCopy(kEchoMsg, Pattern(ContextOptions{}.max_unauthenticated_message_bytes + 1, 6));
  // The server's side of each connection (index 0 is SetUp's).
  ASSERT_TRUE(::tessera::testing::WaitUntil([&] { return Accepted(2) != nullptr; }, 20s));
  EXPECT_TRUE(::tessera::testing::WaitUntil([&] { return ServerSideClosed(2); }, 20s))
      << "the server kept a connection that announced too much";
  EXPECT_FALSE(ServerSideClosed(1)) << "another stranger's connection was closed too";
  small->Close();
  large->Close();
}

TEST_P(TransportTest, PutThenGetByteExactAtUnalignedOffsets) {
  const uint64_t base = remote_->base();
  for (size_t size :
       {size_t{1}, size_t{3}, size_t{4096}, size_t{65535}, size_t{1} << 20, size_t{64} << 20}) {
    if (size > GetParam().max_bytes) continue;
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

// Ids from Context::kMaxUserMessageId up are the backends' own (UCX's
// connect messages): a handler for one is a programming error that stops the
// process at once, naming the id, on every backend.
TEST_P(TransportTest, ReservedMessageIdsCannotBeHandled) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      server_->SetHandler(Context::kMaxUserMessageId + 1,
                          [](const std::shared_ptr<Endpoint>&, std::span<const uint8_t>) {}),
      "message id 65281 is reserved for the transport");
}

// A message id nobody handles comes from the peer, who may not have
// authenticated: each one was a WARN line, so a peer could flood the log.
// Now at most 10 a minute are written, on every backend.
TEST_P(TransportTest, UnknownMessagesCannotFloodTheLog) {
  // The sink list is changed on the server's progress thread, which is the
  // one that logs the drops, so that no line is being written meanwhile.
  auto on_loop = [&](const std::function<void()>& change) {
    testing::Waiter<bool> changed;
    server_->Post([&change, done = changed.callback()] {
      change();
      done(true);
    });
    ASSERT_TRUE(changed.Wait().has_value());
  };
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  on_loop([&] { Logger().sinks().push_back(sink); });
  for (int i = 0; i < 50; ++i) ep_->Send(55, {1, 2, 3});
  ep_->Send(kEchoMsg, {7});  // handled after the 50, on the same connection
  EXPECT_EQ(NextReply(), std::vector<uint8_t>{7});
  on_loop([&] { Logger().sinks().pop_back(); });
  const std::string text = log.str();
  size_t lines = 0;
  for (size_t at = text.find("no handler for message 55"); at != std::string::npos;
       at = text.find("no handler for message 55", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u) << text;
  EXPECT_LE(lines, 10u) << text;
}

// An endpoint that says so delivers a message only after the puts issued
// before it have landed: the client's push then needs no flush before its
// message. Checked with puts large enough to take many socket writes.
TEST_P(TransportTest, PutsLandBeforeLaterMessagesWhereClaimed) {
  if (!ep_->PutsLandBeforeLaterMessages()) {
    GTEST_SKIP() << GetParam().backend << " makes no such promise (a push flushes first)";
  }
  for (size_t size : {size_t{1}, size_t{4096}, size_t{1} << 20, size_t{8} << 20}) {
    if (size > GetParam().max_bytes) continue;
    for (uint32_t round = 0; round < 4; ++round) {
      const uint64_t offset = 64 + round;
      auto src = Pattern(size, static_cast<uint32_t>(size) + round);
      std::atomic<int> puts_failed{0};
      ep_->Put(src.data(), size, *remote_, remote_->base() + offset, [&](Status st) {
        if (!st.ok()) puts_failed++;
      });
      const uint64_t where[2] = {offset, size};
      ep_->SendCopy(kSnapshotMsg,
                    std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(where),
                                             reinterpret_cast<const uint8_t*>(where + 2)));
      auto seen = NextReply();
      ASSERT_EQ(seen.size(), size);
      EXPECT_TRUE(seen == src) << "the message of round " << round << " overtook its put of "
                               << size << " bytes";
      ASSERT_TRUE(Wait([&](Completion c) { ep_->Flush(c); }).ok());
      EXPECT_EQ(puts_failed.load(), 0);
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

// What the target enforces whatever the peer claims, checked with bytes the
// client's own checks let through: a key forged from the writer's own
// memory (a well-formed description of the target's address and size, with
// the key of a region the client registered), and a write to memory the
// target registered read-only. Tessera's tcp refuses both itself; on verbs
// the HCA does; on UCX's rc_verbs the HCA checks keys only. The target's
// memory must not change.
TEST_P(TransportTest, KeyForgedFromOwnMemoryReachesNoMemory) {
  if (!GetParam().enforces_keys) {
    GTEST_SKIP() << "this transport checks no keys (UCX's tcp, shared memory, self): Tessera "
                    "uses it only where every peer is trusted (docs/security.md)";
  }
  const auto before = Pattern(4096, 11);
  std::memcpy(server_region_->data(), before.data(), before.size());
  auto own = client_ctx_->Allocate(4096, MemoryKind::kHost);
  ASSERT_TRUE(own.ok()) << own.status();
  const auto own_desc_bytes = (*own)->Describe();
  const auto target_desc_bytes = server_region_->Describe();
  auto own_desc = DecodeRegionDesc(own_desc_bytes);
  auto target = DecodeRegionDesc(target_desc_bytes);
  ASSERT_TRUE(own_desc.ok() && target.ok());
  auto forged =
      ep_->Attach(EncodeRegionDesc(target->backend, target->base, target->size, own_desc->key));
  ASSERT_TRUE(forged.ok()) << "the forged key should pass the client's checks: " << forged.status();
  std::vector<uint8_t> junk(64, 0xee);
  Status put = Wait(
      [&](Completion c) { ep_->Put(junk.data(), junk.size(), **forged, (*forged)->base(), c); });
  // A put may complete locally and fail at the target (UCX): the flush says.
  if (put.ok()) put = Wait([&](Completion c) { ep_->Flush(c); });
  EXPECT_FALSE(put.ok()) << "a put with a forged key completed at the target";
  std::vector<uint8_t> got(64);
  Status get =
      Wait([&](Completion c) { ep_->Get(got.data(), got.size(), **forged, (*forged)->base(), c); });
  EXPECT_FALSE(get.ok()) << "a get with a forged key completed";
  EXPECT_EQ(std::memcmp(server_region_->data(), before.data(), before.size()), 0)
      << "the target's memory changed";
}

TEST_P(TransportTest, ReadOnlyRegionCannotBeWritten) {
  if (!GetParam().enforces_access) {
    GTEST_SKIP() << "this transport does not enforce read-only registrations (UCX registers "
                    "memory with every remote access; measured with UCX 1.13 on Soft-RoCE): "
                    "docs/security.md says what that leaves open";
  }
  std::vector<uint8_t> memory = Pattern(4096, 12);
  const auto before = memory;
  auto ro = server_->Register(memory.data(), memory.size(), MemoryKind::kHost, RemoteAccess::kRead);
  ASSERT_TRUE(ro.ok()) << ro.status();
  auto remote = ep_->Attach((*ro)->Describe());
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::vector<uint8_t> got(memory.size());
  ASSERT_TRUE(Wait([&](Completion c) {
                ep_->Get(got.data(), got.size(), **remote, (*remote)->base(), c);
              }).ok());
  EXPECT_EQ(got, before) << "a read of the read-only region";
  std::vector<uint8_t> junk(64, 0xee);
  Status put = Wait(
      [&](Completion c) { ep_->Put(junk.data(), junk.size(), **remote, (*remote)->base(), c); });
  if (put.ok()) put = Wait([&](Completion c) { ep_->Flush(c); });
  EXPECT_FALSE(put.ok()) << "a put into a read-only region completed at the target";
  EXPECT_EQ(memory, before) << "the read-only region changed";
}

// A worker's staging slot takes one-sided writes from its own connection
// only: another connection holding the same key (a reader that captured
// it) writes nothing. Tessera's tcp checks the writer itself; verbs binds a
// type-2B memory window to the writer's queue pair, and the HCA refuses the
// key on any other. UCX cannot tie a key to an endpoint (docs/security.md).
TEST_P(TransportTest, ARegionBoundToAConnectionTakesWritesFromItOnly) {
  auto slot = server_->Allocate(4096, MemoryKind::kHost, RemoteAccess::kWrite);
  ASSERT_TRUE(slot.ok()) << slot.status();
  std::memset((*slot)->data(), 0x11, 4096);
  ASSERT_TRUE(testing::WaitUntil([&] { return Accepted(0) != nullptr; }, 20s));
  const Status bound = (*slot)->TakeWritesOnlyFrom(*Accepted(0));
  const bool ucx = std::string(GetParam().backend) == "ucx";
  const bool no_windows =
      bound.message().find("has no type-2B memory windows") != std::string::npos;
  if (bound.code() == StatusCode::kUnimplemented && (ucx || no_windows)) {
    GTEST_SKIP() << bound.message();
  }
  ASSERT_TRUE(bound.ok()) << bound;
  const std::vector<uint8_t> desc = (*slot)->Describe();

  auto mine = ep_->Attach(desc);
  ASSERT_TRUE(mine.ok()) << mine.status();
  std::vector<uint8_t> good(64, 0x77);
  ASSERT_TRUE(Wait([&](Completion c) {
                ep_->Put(good.data(), good.size(), **mine, (*mine)->base(), c);
              }).ok());
  ASSERT_TRUE(Wait([&](Completion c) { ep_->Flush(c); }).ok());
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return static_cast<const uint8_t*>((*slot)->data())[63] == 0x77; }, 20s))
      << "the owner's put never landed";

  Waiter<Result<std::shared_ptr<Endpoint>>> connected;
  client_ctx_->Connect(host_, listener_->port(), 10s, connected.callback());
  auto other = connected.Wait();
  ASSERT_TRUE(other.has_value() && other->ok());
  std::shared_ptr<Endpoint> thief = other->value();
  thief->MarkAuthenticated();
  auto theirs = thief->Attach(desc);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  std::vector<uint8_t> junk(64, 0xee);
  Status put = Wait([&](Completion c) {
    thief->Put(junk.data(), junk.size(), **theirs, (*theirs)->base() + 128, c);
  });
  if (put.ok()) put = Wait([&](Completion c) { thief->Flush(c); });
  EXPECT_FALSE(put.ok()) << "another connection's put with the slot's key completed";
  std::printf("the other connection's put: %s\n", put.ToString().c_str());
  const auto* bytes = static_cast<const uint8_t*>((*slot)->data());
  EXPECT_EQ(std::count(bytes + 64, bytes + 4096, 0x11), 4096 - 64)
      << "another connection wrote the bound slot";
  thief->Close();
}

TEST_P(TransportTest, ConnectToDeadAddressFailsWithinTimeout) {
  Waiter<Result<std::shared_ptr<Endpoint>>> w;
  auto start = std::chrono::steady_clock::now();
  client_ctx_->Connect(host_, tessera::testing::UnusedPort(), 2s, w.callback());
  auto r = w.Wait(10s);
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.has_value()) << "connect to a dead address never called back";
  EXPECT_FALSE(r->ok());
  EXPECT_LT(elapsed, 4s) << "failure took longer than the 2 s timeout";
  EXPECT_NE(r->status().message().find(host_), std::string::npos) << r->status().ToString();
}

// Each listener hands its connections to its own handler, also when the
// context opened another listener after it.
TEST_P(TransportTest, EachListenerHandsItsConnectionsToItsOwnHandler) {
  std::atomic<int> second_took{0};
  auto second = server_->Listen(host_, 0, [&](const std::shared_ptr<Endpoint>&) { second_took++; });
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const size_t before = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return accepted_.size();
  }();
  for (uint16_t port : {listener_->port(), (*second)->port()}) {
    Waiter<Result<std::shared_ptr<Endpoint>>> connected;
    client_ctx_->Connect(host_, port, 10s, connected.callback());
    auto ep = connected.Wait();
    ASSERT_TRUE(ep.has_value()) << "connect to port " << port << " did not call back";
    ASSERT_TRUE(ep->ok()) << ep->status().ToString();
    (**ep)->Close();
  }
  EXPECT_TRUE(WaitUntil([&] { return Accepted(before) != nullptr; }, 10s))
      << "the first listener's handler never got its connection";
  EXPECT_TRUE(WaitUntil([&] { return second_took.load() == 1; }, 10s))
      << "the second listener's handler got " << second_took.load() << " connections, not 1";
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(accepted_.size(), before + 1) << "the first listener's handler got another's";
  }
}

// A connection made the moment a listener opens is handed to its handler
// like any other. UCX once acknowledged such a connection without handing
// it up (the handler was set after ucp_listener_create returned), and its
// peer's handshake then waited forever: a launch under a CPU hog in CI.
// Connects to `port` again at once after each refusal, until a listener
// takes it (or the test gives up); shared with the attempts in flight,
// which may outlive a failed round.
struct ConnectRace {
  Context* ctx = nullptr;
  std::string host;
  uint16_t port = 0;
  std::function<void(Result<std::shared_ptr<Endpoint>>)> done;
  std::atomic<int> refused{0}, handed_up{0};
  std::atomic<bool> give_up{false};
};

void AttemptRace(const std::shared_ptr<ConnectRace>& race) {
  race->ctx->Connect(race->host, race->port, 5s, [race](Result<std::shared_ptr<Endpoint>> r) {
    if (r.ok() || race->give_up) return race->done(std::move(r));
    race->refused++;
    AttemptRace(race);
  });
}

TEST_P(TransportTest, ConnectionsRacingTheListenersOpeningAreHandedUp) {
  for (int round = 0; round < 5; ++round) {
    auto race = std::make_shared<ConnectRace>();
    race->ctx = client_ctx_;
    race->host = host_;
    race->port = tessera::testing::UnusedPort();
    Waiter<Result<std::shared_ptr<Endpoint>>> connected;
    race->done = connected.callback();
    AttemptRace(race);
    const bool refused_first = WaitUntil([&] { return race->refused.load() > 0; }, 10s);
    auto listener = server_->Listen(
        host_, race->port, [race](const std::shared_ptr<Endpoint>&) { race->handed_up++; });
    if (!listener.ok()) race->give_up = true;
    auto ep = connected.Wait();
    race->give_up = true;
    ASSERT_TRUE(refused_first) << "no refusal before the listener opened";
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    ASSERT_TRUE(ep.has_value()) << "round " << round << ": connect did not call back";
    ASSERT_TRUE(ep->ok()) << "round " << round << ": " << ep->status().ToString();
    EXPECT_TRUE(WaitUntil([&] { return race->handed_up.load() == 1; }, 10s))
        << "round " << round << ": the connection was taken (after " << race->refused.load()
        << " refusals) but handed to the listener's handler " << race->handed_up.load() << " times";
    (**ep)->Close();
  }
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

// GPU memory this build cannot register is refused at registration, saying
// why, never accepted and then failing at the first transfer.
// Where GPU memory cannot be registered (here: Debian's UCX has no CUDA, and
// there is no GPU driver), registration refuses at once and says what is
// missing: the UCX build and its memory types, or CUDA's own answer. The
// native tcp transport moves host memory only, and says so.
TEST_P(TransportTest, GpuMemoryIsRefusedAtRegistrationSayingWhy) {
  const Status can = server_->CanRegister(MemoryKind::kCuda);
  if (can.ok()) GTEST_SKIP() << "this fabric can register GPU memory here: " << server_->Describe();
  EXPECT_TRUE(server_->CanRegister(MemoryKind::kHost).ok());
  const bool ucx = std::string(GetParam().backend) == "ucx";
  const bool tcp = std::string(GetParam().backend) == "tcp";
  // What this machine lacks, in the words the error must use: a UCX without
  // CUDA (Debian's), or one with CUDA but no driver (PyPI's), named with its
  // version and path; verbs: CUDA's own reason, or that the build has none
  // (-Dcuda=disabled).
  if (ucx) {
    EXPECT_NE(can.message().find("this UCX cannot register GPU memory"), std::string::npos)
        << can.ToString();
    EXPECT_NE(can.message().find("UCX 1."), std::string::npos) << can.ToString();
    EXPECT_TRUE(can.message().find("was built without CUDA") != std::string::npos ||
                can.message().find("has CUDA modules") != std::string::npos)
        << can.ToString();
  } else if (tcp) {
    EXPECT_NE(can.message().find("reaches host memory only"), std::string::npos) << can.ToString();
  } else {
    EXPECT_TRUE(can.message().find("no usable GPU") != std::string::npos ||
                can.message().find("this build of Tessera has no CUDA") != std::string::npos)
        << can.ToString();
  }

  auto allocated = server_->Allocate(1 << 20, MemoryKind::kCuda);
  ASSERT_FALSE(allocated.ok()) << "GPU memory accepted by a backend that cannot register it";
  EXPECT_EQ(allocated.status().ToString(), can.ToString());
  std::vector<uint8_t> host(4096);
  auto registered = server_->Register(host.data(), host.size(), MemoryKind::kCuda);
  ASSERT_FALSE(registered.ok());
  EXPECT_EQ(registered.status().ToString(), can.ToString());
}

// A peer process killed in the middle of a stream of reads: the reads fail,
// and the connection is reported lost, within a bound; nothing hangs.
TEST(VerbsFailure, PeerKilledMidTransferFailsWithinBound) {
  if (RdmaAddress() == nullptr) {
    GTEST_SKIP() << "no RDMA device on this machine: runs inside the Soft-RoCE VM";
  }
  const std::string host = RdmaAddress();
  const uint16_t port = tessera::testing::UnusedPort();
  constexpr size_t kBytes = 8u << 20;
  // The peer is forked before this process opens any RDMA resource.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ContextOptions opts;
    opts.backend = "verbs";
    auto ctx = Context::Open(opts);
    if (!ctx.ok()) _exit(2);
    auto region = (*ctx)->Allocate(kBytes, MemoryKind::kHost);
    if (!region.ok()) _exit(3);
    auto listener = (*ctx)->Listen(host, port, [&](const std::shared_ptr<Endpoint>& ep) {
      ep->SendCopy(kDescribeMsg + 100, (*region)->Describe());
    });
    if (!listener.ok()) _exit(4);
    pause();
    _exit(0);
  }
  ContextOptions opts;
  opts.backend = "verbs";
  auto ctx = Context::Open(opts);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  Waiter<std::vector<uint8_t>> desc;
  auto on_desc = desc.callback();
  (*ctx)->SetHandler(kDescribeMsg + 100,
                     [on_desc](const std::shared_ptr<Endpoint>&, std::span<const uint8_t> bytes) {
                       on_desc(std::vector<uint8_t>(bytes.begin(), bytes.end()));
                     });
  Waiter<Status> lost;
  auto on_lost = lost.callback();
  (*ctx)->SetDisconnectHandler(
      [on_lost](const std::shared_ptr<Endpoint>&, const Status& why) { on_lost(why); });
  std::shared_ptr<Endpoint> ep;
  for (int attempt = 0; attempt < 100 && !ep; ++attempt) {
    Waiter<Result<std::shared_ptr<Endpoint>>> connected;
    (*ctx)->Connect(host, port, 2s, connected.callback());
    auto r = connected.Wait(5s);
    if (r && r->ok()) {
      ep = r->value();
    } else {
      std::this_thread::sleep_for(100ms);
    }
  }
  ASSERT_TRUE(ep) << "could not connect to the forked peer";
  auto d = desc.Wait(10s);
  ASSERT_TRUE(d.has_value());
  auto remote = ep->Attach(*d);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  std::vector<uint8_t> buf(kBytes);
  std::atomic<int> ok{0}, failed{0};
  std::atomic<bool> killed{false};
  Status first_error;
  std::mutex mu;
  const auto start = std::chrono::steady_clock::now();
  while (failed.load() == 0 && std::chrono::steady_clock::now() - start < 20s) {
    Waiter<Status> w;
    ep->Get(buf.data(), kBytes, **remote, (*remote)->base(), w.callback());
    if (!killed.exchange(true)) kill(child, SIGKILL);
    auto st = w.Wait(15s);
    ASSERT_TRUE(st.has_value()) << "a read to a killed peer neither completed nor failed";
    if (st->ok()) {
      ok++;
    } else {
      failed++;
      std::lock_guard<std::mutex> lock(mu);
      first_error = *st;
    }
  }
  waitpid(child, nullptr, 0);
  EXPECT_GT(failed.load(), 0) << "reads kept succeeding after the peer was killed";
  EXPECT_EQ(first_error.code(), StatusCode::kUnavailable) << first_error.ToString();
  auto why = lost.Wait(15s);
  ASSERT_TRUE(why.has_value()) << "the lost connection was never reported";
  EXPECT_EQ(why->code(), StatusCode::kUnavailable) << why->ToString();
  EXPECT_NE(why->message().find(host), std::string::npos) << why->ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// Registered memory is locked memory: past RLIMIT_MEMLOCK registration fails,
// and the error says which limit and how to raise it. Run with a small
// `ulimit -l` and without CAP_IPC_LOCK (tests/rdma_vm_suite.sh does).
TEST(VerbsFailure, RegistrationBeyondTheLockedMemoryLimitNamesUlimit) {
  if (RdmaAddress() == nullptr || std::getenv("TESSERA_TEST_MEMLOCK_LIMITED") == nullptr) {
    GTEST_SKIP() << "needs an RDMA device and a lowered locked-memory limit (the Soft-RoCE VM "
                    "suite runs it so)";
  }
  ContextOptions opts;
  opts.backend = "verbs";
  auto ctx = Context::Open(opts);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto region = (*ctx)->Allocate(256u << 20, MemoryKind::kHost);
  ASSERT_FALSE(region.ok()) << "256 MiB registered past the locked-memory limit";
  EXPECT_EQ(region.status().code(), StatusCode::kResourceExhausted) << region.status().ToString();
  EXPECT_NE(region.status().message().find("ulimit -l"), std::string::npos)
      << region.status().ToString();
  auto small = (*ctx)->Allocate(64u << 10, MemoryKind::kHost);
  EXPECT_TRUE(small.ok()) << "a small registration fails too: " << small.status().ToString();
}

// Choosing the verbs device by name: an unknown name is refused naming the
// devices there are; the right one works.
TEST(VerbsSelection, DeviceByName) {
  if (RdmaAddress() == nullptr) {
    GTEST_SKIP() << "no RDMA device on this machine: runs inside the Soft-RoCE VM";
  }
  ContextOptions opts;
  opts.backend = "verbs";
  opts.device = "mlx9_nosuch";
  auto bad = Context::Open(opts);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("rxe0"), std::string::npos) << bad.status().ToString();
  opts.device = "rxe0";
  auto ctx = Context::Open(opts);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto listener = (*ctx)->Listen(RdmaAddress(), 0, [](const std::shared_ptr<Endpoint>&) {});
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  Waiter<Result<std::shared_ptr<Endpoint>>> connected;
  (*ctx)->Connect(RdmaAddress(), (*listener)->port(), 10s, connected.callback());
  auto ep = connected.Wait();
  ASSERT_TRUE(ep.has_value());
  ASSERT_TRUE(ep->ok()) << ep->status().ToString();
  EXPECT_NE((**ep)->DescribeLanes().find("rxe0"), std::string::npos);
  (**ep)->Close();
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest, BackendCases(), BackendCaseName);

// With a loopback cluster UCX still opened its tcp interface on the host's
// other addresses: with UCX's tcp on, a context may use loopback interfaces
// and RDMA ports only, unless the network is said to be trusted.
TEST(UcxTcpPolicy, UcxTcpOpensLoopbackInterfacesOnly) {
  const std::vector<NetInterface> here = {{"lo", true}, {"eth0", false}};
  const std::vector<std::string> ports = {"mlx5_0:1"};
  EXPECT_EQ(UcxNetDevicesForTcpPolicy(nullptr, nullptr, nullptr, here, ports).value(),
            "lo,mlx5_0:1");
  EXPECT_EQ(UcxNetDevicesForTcpPolicy("tcp:aux,sm", "", nullptr, here, {}).value(), "lo");
  EXPECT_EQ(UcxNetDevicesForTcpPolicy("rc,sm", nullptr, nullptr, here, ports).value(), "")
      << "without UCX's tcp, UCX's choice stands";
  EXPECT_EQ(UcxNetDevicesForTcpPolicy(nullptr, nullptr, "1", here, ports).value(), "");
  EXPECT_EQ(UcxNetDevicesForTcpPolicy("tcp", "lo,mlx5_0:1", nullptr, here, ports).value(), "");
  for (const char* named : {"eth0", "lo,eth0", "all"}) {
    auto refused = UcxNetDevicesForTcpPolicy("tcp", named, nullptr, here, ports);
    ASSERT_FALSE(refused.ok()) << named;
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("TESSERA_ALLOW_UCX_TCP=1"), std::string::npos);
  }
}

// UCX tcp protects no memory: UCX may listen or connect off loopback only
// when its tcp transport is off, or when the user says the network is trusted.
TEST(UcxTcpPolicy, OffLoopbackOnlyWithoutTcpOrWhenAllowed) {
  EXPECT_TRUE(UcxTcpEnabled(nullptr)) << "UCX's default is all";
  EXPECT_TRUE(UcxTcpEnabled("tcp"));
  EXPECT_TRUE(UcxTcpEnabled("posix,sysv,cma,tcp"));
  EXPECT_TRUE(UcxTcpEnabled("all"));
  EXPECT_TRUE(UcxTcpEnabled("^rc"));
  EXPECT_FALSE(UcxTcpEnabled("rc,sm"));
  EXPECT_FALSE(UcxTcpEnabled("^tcp"));
  // Every form UCX accepts is parsed, not matched: "tcp:aux,sm" (tcp for
  // wire-up) passed the loopback-only check as if tcp were off.
  EXPECT_TRUE(UcxTcpEnabled("tcp:aux,sm"));
  EXPECT_TRUE(UcxTcpEnabled("sm, TCP"));
  EXPECT_TRUE(UcxTcpEnabled(" ^rc"));
  EXPECT_TRUE(UcxTcpEnabled(""));
  EXPECT_FALSE(UcxTcpEnabled("^tcp:aux"));
  EXPECT_FALSE(UcxTcpEnabled("^ Tcp ,rc"));
  EXPECT_FALSE(UcxTcpEnabled("^all"));

  const char* saved_tls = std::getenv("UCX_TLS");
  const std::string restore = saved_tls ? saved_tls : "";
  unsetenv("TESSERA_ALLOW_UCX_TCP");
  setenv("UCX_TLS", "tcp", 1);
  EXPECT_TRUE(CheckUcxTcpAllowed(Resolve("127.0.0.1", 7000).value(), "listening").ok());
  Status off_loopback = CheckUcxTcpAllowed(Resolve("10.1.2.3", 7000).value(), "listening on x");
  EXPECT_EQ(off_loopback.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(off_loopback.message().find("--transport tcp"), std::string::npos)
      << off_loopback.ToString();
  setenv("TESSERA_ALLOW_UCX_TCP", "1", 1);
  EXPECT_TRUE(CheckUcxTcpAllowed(Resolve("10.1.2.3", 7000).value(), "listening").ok());
  unsetenv("TESSERA_ALLOW_UCX_TCP");
  setenv("UCX_TLS", "rc,sm", 1);
  EXPECT_TRUE(CheckUcxTcpAllowed(Resolve("10.1.2.3", 7000).value(), "listening").ok());
  if (saved_tls) {
    setenv("UCX_TLS", restore.c_str(), 1);
  } else {
    unsetenv("UCX_TLS");
  }
}

}  // namespace
}  // namespace tessera::transport

namespace tessera::transport::tcp {
namespace {

// Each AES-256-GCM library this build has; a library that cannot run here
// is skipped by the tests, which say so.
std::vector<GcmLibrary> Libraries() { return {GcmLibrary::kOpenSsl, GcmLibrary::kIpsecMb}; }

std::string LibraryName(const ::testing::TestParamInfo<GcmLibrary>& info) {
  return info.param == GcmLibrary::kOpenSsl ? "OpenSsl" : "IpsecMb";
}

class SessionCipherTest : public ::testing::TestWithParam<GcmLibrary> {
 protected:
  void SetUp() override {
    if (GetParam() == GcmLibrary::kIpsecMb && !GcmEngine::IpsecMbRunsHere()) {
      GTEST_SKIP() << "IPsec-MB is not built in or cannot run on this CPU; OpenSSL is used";
    }
  }
  std::unique_ptr<SessionCipher> Make(const SessionKeys::Half& keys, SessionCipher::Direction d,
                                      bool encrypt, GcmLibrary library) {
    return SessionCipher::Create(keys, {.direction = d, .encrypt = encrypt, .library = library})
        .value();
  }
};

// The records a protected tcp session sends: encrypted ("on") or only
// authenticated ("integrity"); any byte altered, or a record out of turn,
// fails its tag.
TEST_P(SessionCipherTest, RecordsAreSealedOpenedAndRefusedWhenAltered) {
  using Direction = SessionCipher::Direction;
  for (bool encrypt : {true, false}) {
    const SessionKeys keys = TestSessionKeys(/*server=*/false, encrypt);
    auto seal = Make(keys.send, Direction::kSeal, encrypt, GetParam());
    auto open = Make(keys.send, Direction::kOpen, encrypt, GetParam());
    std::vector<uint8_t> plain(1000);
    for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<uint8_t>(i * 7);
    std::vector<uint8_t> first(plain.size() + kSealTagBytes), second(first.size());
    seal->Seal(plain.data(), plain.size(), first.data());
    seal->Seal(plain.data(), plain.size(), second.data());
    EXPECT_EQ(std::equal(plain.begin(), plain.end(), first.begin()), !encrypt)
        << (encrypt ? "an encrypted record holds its plain bytes" : "integrity changed the bytes");
    EXPECT_NE(first, second) << "two records under one nonce";
    auto altered = first;
    altered[500] ^= 1;
    EXPECT_FALSE(open->Open(altered.data(), plain.size())) << "an altered byte passed";
    auto bad_tag = second;
    bad_tag[plain.size() + kSealTagBytes - 1] ^= 0x80;
    // The receiver's sequence moved on: the untouched first record is now out of turn.
    auto copy = first;  // (opening decrypts in place)
    EXPECT_FALSE(open->Open(copy.data(), plain.size())) << "a record out of turn passed";
    auto fresh = Make(keys.send, Direction::kOpen, encrypt, GetParam());
    ASSERT_TRUE(fresh->Open(first.data(), plain.size()));
    EXPECT_TRUE(std::equal(plain.begin(), plain.end(), first.begin()));
    EXPECT_FALSE(fresh->Open(bad_tag.data(), plain.size())) << "an altered tag passed";
  }
}

// Peers need not run the same library: what one seals, in any pieces, the
// other opens, byte for byte and tag for tag. OpenSSL is the reference.
TEST_P(SessionCipherTest, SealsTheSameBytesAndTagsAsOpenSsl) {
  using Direction = SessionCipher::Direction;
  for (bool encrypt : {true, false}) {
    const SessionKeys keys = TestSessionKeys(/*server=*/true, encrypt);
    auto reference = Make(keys.send, Direction::kSeal, encrypt, GcmLibrary::kOpenSsl);
    auto seal = Make(keys.send, Direction::kSeal, encrypt, GetParam());
    auto open = Make(keys.send, Direction::kOpen, encrypt, GetParam());
    for (size_t len :
         {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{4096}, size_t{65537}}) {
      for (size_t piece : {size_t{1}, size_t{7}, size_t{16}, size_t{1000}, size_t{1} << 20}) {
        if (piece == 1 && len > 4096) continue;
        std::vector<uint8_t> plain(len);
        for (size_t i = 0; i < len; ++i) plain[i] = static_cast<uint8_t>(i * 13 + 5);
        std::vector<uint8_t> want(len + kSealTagBytes), got(len + kSealTagBytes);
        reference->Seal(plain.data(), len, want.data());
        seal->Begin();
        for (size_t at = 0; at < len; at += piece) {
          seal->Update(plain.data() + at, got.data() + at, std::min(piece, len - at));
        }
        seal->EndSeal(got.data() + len);
        ASSERT_EQ(got, want) << len << " B in pieces of " << piece
                             << (encrypt ? "" : ", integrity");
        open->Begin();
        for (size_t at = 0; at < len; at += piece) {
          open->Update(got.data() + at, got.data() + at, std::min(piece, len - at));
        }
        ASSERT_TRUE(open->EndOpen(got.data() + len)) << len << " B in pieces of " << piece;
        ASSERT_TRUE(std::equal(plain.begin(), plain.end(), got.begin()));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Libraries, SessionCipherTest, ::testing::ValuesIn(Libraries()),
                         LibraryName);

}  // namespace
}  // namespace tessera::transport::tcp
