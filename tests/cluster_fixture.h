// The cluster tests' fixture: shards and workers in one process (separate
// transport contexts, real UCX connections), over each UCX transport, and a
// peer that speaks the wire protocol by hand for what a Client never sends.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "core/secret.h"
#include "tessera/client.h"
#include "tessera/server.h"
#include "tests/test_util.h"
#include "transport/transport.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace tessera::testing {

using namespace std::chrono_literals;

// A peer that speaks the wire protocol by hand, for what a Client never sends.
class RawPeer {
 public:
  RawPeer(const TaskAddress& addr, const std::string& backend)
      : ctx_(transport::Context::Open({.backend = backend}).value()) {
    ctx_->SetHandler(
        1, [this](const std::shared_ptr<transport::Endpoint>&, std::span<const uint8_t> f) {
          std::lock_guard<std::mutex> lock(mu_);
          frames_.emplace_back(f.begin(), f.end());
          cv_.notify_all();
        });
    testing::Waiter<Result<std::shared_ptr<transport::Endpoint>>> connected;
    ctx_->Connect(addr.host, addr.port, 5s, connected.callback());
    auto ep = connected.Wait();
    if (ep && ep->ok()) ep_ = ep->value();
  }
  ~RawPeer() {
    if (ep_) ep_->Close();
  }
  bool connected() const { return ep_ != nullptr; }
  transport::Endpoint& endpoint() { return *ep_; }

  template <typename Msg>
  void Send(const Msg& msg, uint64_t request_id, uint32_t flags = 0) {
    ep_->Send(1, wire::Encode(msg, request_id, flags));
  }
  // The next frame from the shard, or empty after 5 s.
  std::vector<uint8_t> Next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 5s, [&] { return !frames_.empty(); });
    if (frames_.empty()) return {};
    auto f = frames_.front();
    frames_.erase(frames_.begin());
    return f;
  }
  // Hello, then an auth proof made with `secret`; returns the shard's answer
  // to it (or its refusal of the hello).
  std::vector<uint8_t> Authenticate(const std::string& secret, const wire::Hello& hello) {
    wire::ClientHandshake handshake(secret, hello);
    Send(handshake.hello(), 1);
    auto first = Next();
    auto next = handshake.OnFrame(first, std::nullopt, "the shard");
    if (!next.ok() || !std::holds_alternative<wire::Auth>(*next)) return first;
    Send(std::get<wire::Auth>(*next), 2);
    return Next();
  }

 private:
  std::unique_ptr<transport::Context> ctx_;
  std::shared_ptr<transport::Endpoint> ep_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> frames_;
};

// A cluster in this process: shards started as Servers, workers as Clients,
// on loopback (or host_). What every cluster-level test builds on; the
// parameterised ClusterTest below and the checkpoint tests add their own.
class ClusterFixture {
 public:
  // A fresh spec of `num_ps` ps tasks and `num_workers` workers on host_.
  void NewSpec(int num_ps, int num_workers) {
    spec_ = ClusterSpec();
    AddPsAndWorkers(num_ps, num_workers);
  }
  // The ps and worker jobs, beside what spec_ holds already (a chief, a
  // coordinator).
  void AddPsAndWorkers(int num_ps, int num_workers) {
    std::vector<TaskAddress> ps, workers;
    const auto ports = testing::UnusedPortsBeside(spec_, static_cast<size_t>(num_ps + num_workers));
    for (int i = 0; i < num_ps; ++i) ps.push_back({host_, ports[i]});
    for (int i = 0; i < num_workers; ++i) workers.push_back({host_, ports[num_ps + i]});
    ASSERT_TRUE(spec_.AddJob("ps", ps).ok());
    ASSERT_TRUE(spec_.AddJob("worker", workers).ok());
  }
  // What ps task `task` of spec_ starts with (before configure_server_).
  ServerOptions ServerOptionsFor(int task) const {
    ServerOptions opts;
    opts.cluster = spec_;
    opts.task_index = task;
    opts.secret = secret_;
    opts.staging_bytes_per_worker = 16u << 20;
    opts.lease_timeout = lease_timeout_;
    opts.transport = transport_;
    return opts;
  }
  // Starts ps tasks 0..running-1 of spec_ (the rest are never started).
  void StartServers(int running) {
    for (int i = 0; i < running; ++i) {
      ServerOptions opts = ServerOptionsFor(i);
      if (configure_server_) configure_server_(opts);
      auto server = Server::Start(opts);
      ASSERT_TRUE(server.ok()) << server.status().ToString();
      servers_.push_back(std::move(*server));
    }
  }
  // Like `tessera launch`: the coordinator (ps 0) stops first.
  void StopCluster() {
    clients_.clear();
    for (auto& s : servers_) s->Stop();
    servers_.clear();
  }

  ClientOptions Options(int worker) const {
    ClientOptions opts;
    opts.cluster = spec_;
    opts.task = {"worker", worker};
    opts.secret = secret_;
    opts.transport = transport_;
    opts.startup_timeout = 10s;
    opts.op_timeout = 30s;
    opts.chunk_bytes = chunk_bytes_;
    return opts;
  }
  Client& Connect(const ClientOptions& opts) {
    clients_.push_back(
        testing::ValueOrThrow(Client::Connect(opts), "connecting " + opts.task.ToString()));
    return *clients_.back();
  }
  Client& Connect(int worker) { return Connect(Options(worker)); }

  // The shards report the steps they counted to the coordinator after the
  // push returns: poll for the global step to reach `want` (up to 10 s).
  static uint64_t EventualGlobalStep(Client& c, uint64_t want) {
    uint64_t got = 0;
    for (int i = 0; i < 500; ++i) {
      auto r = c.GlobalStep();
      if (!r.ok()) return UINT64_MAX;
      got = *r;
      if (got >= want) break;
      std::this_thread::sleep_for(20ms);
    }
    return got;
  }

  static TensorSpec F32(std::string name, int64_t n, UpdateRule rule = UpdateRule::kAdd) {
    return {std::move(name), DType::kF32, {n}, rule, {}, -1};
  }

 protected:
  std::string transport_ = "tcp";   // Tessera's own sockets, the library's default
  std::string host_ = "127.0.0.1";  // where the cluster's tasks listen
  uint64_t chunk_bytes_ = 1u << 20;
  std::chrono::milliseconds lease_timeout_{30'000};
  std::function<void(ServerOptions&)> configure_server_;  // before each shard starts
  std::string secret_ = GenerateSecret().value();
  ClusterSpec spec_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<Client>> clients_;
};

// The parameter: "native" for Tessera's own tcp transport, "verbs" for the
// verbs transport (inside the Soft-RoCE VM only: RDMA_VM_ADDR), else the
// UCX_TLS of the UCX transport.
class ClusterTest : public ::testing::TestWithParam<const char*>, public ClusterFixture {
 public:
  static std::string Name(const ::testing::TestParamInfo<const char*>& param) {
    const std::string p = param.param;
    return p == "native" ? "native_tcp" : p == "tcp" ? "tcp" : p == "verbs" ? "verbs" : "shm";
  }

 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "verbs") {
      const char* rdma = std::getenv("RDMA_VM_ADDR");
      if (rdma == nullptr) {
        GTEST_SKIP() << "no RDMA device on this machine: the verbs cases run inside the "
                        "Soft-RoCE VM (meson test --suite rdma-vm, tests/rdma-vm/run)";
      }
      host_ = rdma;
      transport_ = "verbs";
      setenv("TESSERA_TRANSPORT", "verbs", 1);
    } else if (std::string(GetParam()) == "native") {
      transport_ = "tcp";
      setenv("TESSERA_TRANSPORT", "tcp", 1);  // for shard processes
    } else {
      transport_ = "ucx";
      setenv("TESSERA_TRANSPORT", "ucx", 1);
      setenv("UCX_TLS", GetParam(), 1);
    }
  }
  // A hand-speaking peer on this case's transport.
  std::unique_ptr<RawPeer> Raw(int ps) const {
    return std::make_unique<RawPeer>(spec_.tasks("ps")[static_cast<size_t>(ps)], transport_);
  }
  void TearDown() override { StopCluster(); }

  // What worker `index` of spec_ says to a shard.
  wire::Hello WorkerHello(int index) const {
    wire::Hello hello;
    hello.task_index = static_cast<uint32_t>(index);
    hello.task = TaskId{"worker", index}.ToString();
    hello.cluster = spec_.ToJson();
    return hello;
  }

  // Starts `running` of `num_ps` shards (the rest of the spec is never started).
  void StartCluster(int num_ps, int num_workers, int running = -1) {
    AddPsAndWorkers(num_ps, num_workers);
    StartServers(running < 0 ? num_ps : running);
  }

  // Two `tessera server` processes and one worker task in the spec.
  std::unique_ptr<ShardProcesses> TwoShardProcesses() {
    const auto ports = UnusedPorts(3);
    EXPECT_TRUE(spec_.AddJob("ps", {{"127.0.0.1", ports[0]}, {"127.0.0.1", ports[1]}}).ok());
    EXPECT_TRUE(spec_.AddJob("worker", {{"127.0.0.1", ports[2]}}).ok());
    return std::make_unique<ShardProcesses>(spec_, secret_, 2);
  }

  // One shard, three workers and a summed sync tensor "w" (f32[4]); worker
  // 2's client is returned separately so a test can make it go away.
  struct SyncWorkers {
    Client& c0;
    Client& c1;
    std::unique_ptr<Client> c2;
    Tensor t0, t1;
  };
  SyncWorkers ThreeSyncWorkers(uint32_t replicas_to_aggregate) {
    StartCluster(1, 3);
    TensorSpec spec{"w", DType::kF32, {4}, UpdateRule::kAdd, {}, -1};
    spec.mode = ConsistencyMode::Sync(replicas_to_aggregate, 3, /*average=*/false);
    Client& c0 = Connect(0);
    Client& c1 = Connect(1);
    auto c2 = Client::Connect(Options(2)).value();
    auto t0 = c0.Declare(spec).value();
    auto t1 = c1.Declare(spec).value();
    EXPECT_TRUE(c2->Declare(spec).ok());
    EXPECT_TRUE(c0.Initialize().ok());
    return {c0, c1, std::move(c2), t0, t1};
  }
};

}  // namespace tessera::testing
