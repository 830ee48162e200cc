// The fixture of the transport contract (transport_test.cc and the cases
// beside it): a server context with an echo, a region and its key, and a
// client context connected to it, for each backend the suite instantiates.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "transport/transport.h"

namespace tessera::transport {

using namespace std::chrono_literals;
using tessera::testing::Waiter;

constexpr uint16_t kEchoMsg = 7;
constexpr uint16_t kDescribeMsg = 8;
constexpr uint16_t kSerialMsg = 9;
// Answered with the region's bytes [offset, offset + length) as they are
// when the message is handled (two u64s in the body).
constexpr uint16_t kSnapshotMsg = 10;

// Set on the threads of the Drive test that drive a context themselves.
inline thread_local bool tls_is_driver = false;

struct TransportCase {
  const char* name;
  const char* backend;  // "ucx" or "verbs"
  const char* ucx_tls;
  bool loopback_self;           // connect a context to its own listener
  const char* expect_rma_lane;  // what the backend must report for put/get
  size_t max_bytes;             // largest transfer tried (software RDMA is slow)
  bool needs_rdma;              // runs only where an RDMA device is (the VM)
  // The target enforces keys on one-sided operations (Tessera's tcp itself;
  // on verbs and UCX's rc_verbs the HCA), and the access a region was
  // registered with (not UCX's rc_verbs: UCX registers memory with every
  // remote access, whatever ucp_mem_map's prot asks). UCX's tcp, shared
  // memory and self enforce neither (docs/security.md).
  bool enforces_keys;
  bool enforces_access;
  // The fixture's connection is protected (Endpoint::ProtectSession) on
  // both sides, as a handshake would leave it: encrypted, or (integrity)
  // authenticated only.
  bool protect = false;
  bool integrity_only = false;
};

// Keys as a handshake derives them, each side's send half the other's receive half.
inline SessionKeys TestSessionKeys(bool server, bool encrypt) {
  SessionKeys keys;
  keys.encrypt = encrypt;
  for (size_t i = 0; i < keys.send.key.size(); ++i) {
    keys.send.key[i] = static_cast<uint8_t>(i + (server ? 1 : 101));
    keys.receive.key[i] = static_cast<uint8_t>(i + (server ? 101 : 1));
  }
  keys.send.iv.fill(server ? 7 : 9);
  keys.receive.iv.fill(server ? 9 : 7);
  return keys;
}

// The address the verbs cases use: one an RDMA device carries. Set inside
// the Soft-RoCE VM (tests/rdma-vm/run); elsewhere the verbs cases skip.
inline const char* RdmaAddress() { return std::getenv("RDMA_VM_ADDR"); }

// Every backend the contract runs on, for each suite that instantiates it
// (the verbs cases skip outside the Soft-RoCE VM).
inline auto BackendCases() {
  return ::testing::Values(
      TransportCase{"native_tcp", "tcp", "", false, "tcp (Tessera's sockets)", 64u << 20, false,
                    true, true},
      TransportCase{"native_tcp_protected", "tcp", "", false, "tcp (Tessera's sockets)", 64u << 20,
                    false, true, true, /*protect=*/true},
      TransportCase{"native_tcp_integrity", "tcp", "", false, "tcp (Tessera's sockets)", 64u << 20,
                    false, true, true, /*protect=*/true, /*integrity_only=*/true},
      TransportCase{"tcp", "ucx", "tcp", false, "tcp/", 64u << 20, false, false, false},
      TransportCase{"shm", "ucx", "posix,sysv,cma,tcp", false, "sysv/memory", 64u << 20, false,
                    false, false},
      TransportCase{"self", "ucx", "self,tcp", true, "self/", 64u << 20, false, false, false},
      TransportCase{"verbs", "verbs", "", false, "verbs RC", 8u << 20, true, true, true},
      TransportCase{"ucx_rc_verbs", "ucx", "rc_verbs", false, "rc_verbs/", 8u << 20, true, true,
                    false});
}

inline std::string BackendCaseName(const ::testing::TestParamInfo<TransportCase>& info) {
  return info.param.name;
}

class TransportTest : public ::testing::TestWithParam<TransportCase> {
 protected:
  void SetUp() override {
    const bool rdma = GetParam().needs_rdma;
    if (rdma && RdmaAddress() == nullptr) {
      GTEST_SKIP() << "no RDMA device on this machine: this case runs inside the Soft-RoCE VM "
                      "(meson test --suite rdma-vm, tests/rdma-vm/run)";
    }
    host_ = rdma ? RdmaAddress() : "127.0.0.1";
    if (*GetParam().ucx_tls) setenv("UCX_TLS", GetParam().ucx_tls, 1);
    if (rdma && std::string(GetParam().backend) == "ucx") {
      // UCX on Soft-RoCE: rxe0's RoCE v2 IPv4 GID is index 1.
      setenv("UCX_NET_DEVICES", "rxe0:1", 1);
      setenv("UCX_IB_GID_INDEX", "1", 1);
    }
    ContextOptions opts;
    opts.backend = GetParam().backend;
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
    server_->SetHandler(kEchoMsg,
                        [](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t> bytes) {
                          from->SendCopy(kEchoMsg + 100, bytes);
                        });
    server_->SetHandler(kSnapshotMsg, [this](const std::shared_ptr<Endpoint>& from,
                                             std::span<const uint8_t> bytes) {
      uint64_t where[2] = {0, 0};
      if (bytes.size() == sizeof(where)) std::memcpy(where, bytes.data(), sizeof(where));
      const auto* at = static_cast<const uint8_t*>(server_region_->data());
      if (where[0] > kRegionSize || where[1] > kRegionSize - where[0]) where[0] = where[1] = 0;
      from->SendCopy(kEchoMsg + 100, {at + where[0], at + where[0] + where[1]});
    });
    server_->SetHandler(kDescribeMsg,
                        [this](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t>) {
                          from->SendCopy(kDescribeMsg + 100, server_region_->Describe());
                        });
    client_ctx_->SetHandler(
        kEchoMsg + 100, [this](const std::shared_ptr<Endpoint>&, std::span<const uint8_t> bytes) {
          std::lock_guard<std::mutex> lock(mu_);
          replies_.emplace_back(bytes.begin(), bytes.end());
          cv_.notify_all();
        });
    // Counts its runs, where they ran, and any two that overlapped.
    server_->SetHandler(kSerialMsg,
                        [](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t> bytes) {
                          from->SendCopy(kSerialMsg + 100, bytes);
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

    // The layer above marks a peer authenticated once it proved itself; the
    // cases here stand in for that at once, except where a case says not.
    auto listener = server_->Listen(host_, 0, [this](const std::shared_ptr<Endpoint>& ep) {
      if (authenticate_accepted_) ep->MarkAuthenticated();
      std::lock_guard<std::mutex> lock(mu_);
      // Only the fixture's own connection: the cases' further ones are plain.
      if (GetParam().protect && accepted_.empty()) {
        EXPECT_TRUE(
            ep->ProtectSession(TestSessionKeys(/*server=*/true, !GetParam().integrity_only)).ok());
      }
      accepted_.push_back(ep);
    });
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(*listener);

    Waiter<Result<std::shared_ptr<Endpoint>>> connected;
    client_ctx_->Connect(host_, listener_->port(), 10s, connected.callback());
    auto ep = connected.Wait();
    ASSERT_TRUE(ep.has_value()) << "connect did not call back";
    ASSERT_TRUE(ep->ok()) << ep->status().ToString();
    ep_ = std::move(ep->value());
    ep_->MarkAuthenticated();
    if (GetParam().protect) {
      ASSERT_TRUE(
          ep_->ProtectSession(TestSessionKeys(/*server=*/false, !GetParam().integrity_only)).ok());
    }

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
    {
      std::lock_guard<std::mutex> lock(mu_);
      accepted_.clear();
    }
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
  std::string host_;
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
  std::atomic<bool> authenticate_accepted_{true};
  std::vector<std::shared_ptr<Endpoint>> accepted_;  // the server's side, guarded by mu_
  std::shared_ptr<Endpoint> Accepted(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return i < accepted_.size() ? accepted_[i] : nullptr;
  }
  // Whether the server closed its side of accepted connection i: a message
  // sent on it fails (one the peer has no handler for, dropped there).
  bool ServerSideClosed(size_t i) {
    constexpr uint16_t kUnhandledMsg = 99;
    Waiter<Status> sent;
    Accepted(i)->Send(kUnhandledMsg, {0}, sent.callback());
    auto st = sent.Wait();
    return st.has_value() && !st->ok();
  }
};

}  // namespace tessera::transport
