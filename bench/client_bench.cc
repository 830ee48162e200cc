// The client's per-call overhead: a shard and a worker in this one process,
// connected over shared memory (UCX `self` cannot connect two UCX contexts,
// so in-process shared memory is the nearest to a transport that costs
// nothing), small tensors, one call at a time. What is left is Tessera's own
// cost: messages, thread hand-offs, bookkeeping. Also the placement of a
// real model's tensors.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

#include "core/placement.h"
#include "core/secret.h"
#include "tessera/client.h"
#include "tessera/server.h"

namespace tessera {
namespace {

class InProcess {
 public:
  static InProcess& Get() {
    static InProcess* cluster = new InProcess();  // lives to the end of the run
    return *cluster;
  }
  Client& client() { return *client_; }
  Tensor small(int i) const { return small_[static_cast<size_t>(i)]; }

 private:
  InProcess() {
    setenv("UCX_TLS", "posix,sysv,cma,tcp", 0);
    setenv("TESSERA_LOG_LEVEL", "warn", 0);
    ClusterSpec spec;
    (void)spec.AddJob("ps", {{"127.0.0.1", 0}});
    (void)spec.AddJob("worker", {{"127.0.0.1", 0}});
    ServerOptions so;
    so.cluster = spec;
    so.secret = GenerateSecret().value();
    so.bind_host = "127.0.0.1";
    // Port 0 in the spec: listen anywhere, then tell the client where.
    server_ = Server::Start(so).value();
    ClusterSpec real;
    (void)real.AddJob("ps", {{"127.0.0.1", server_->port()}});
    (void)real.AddJob("worker", {{"127.0.0.1", 1}});
    ClientOptions co;
    co.cluster = real;
    co.task = {"worker", 0};
    co.secret = so.secret;
    client_ = Client::Connect(co).value();
    std::vector<TensorSpec> specs;
    for (int i = 0; i < 256; ++i) {
      specs.push_back({"s" + std::to_string(i), DType::kF32, {2}, UpdateRule::kAssign, {}, -1});
    }
    small_ = client_->DeclareMany(specs).value();
    (void)client_->Initialize();
  }
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
  std::vector<Tensor> small_;
};

void BM_Push8Bytes(benchmark::State& state) {
  auto& c = InProcess::Get();
  float v[2] = {1, 2};
  for (auto _ : state) {
    if (!c.client().Push({PushItem::Of<float>(c.small(0), v)}).ok()) state.SkipWithError("push");
  }
}
BENCHMARK(BM_Push8Bytes)->UseRealTime();

void BM_Pull8Bytes(benchmark::State& state) {
  auto& c = InProcess::Get();
  float v[2];
  for (auto _ : state) {
    if (!c.client().Pull({PullItem::Of<float>(c.small(0), v)}).ok()) state.SkipWithError("pull");
  }
}
BENCHMARK(BM_Pull8Bytes)->UseRealTime();

// 256 small tensors in one call, against one (the target: at most 3x).
void BM_PushBatchOf8Bytes(benchmark::State& state) {
  auto& c = InProcess::Get();
  const int n = static_cast<int>(state.range(0));
  std::vector<float> v(2 * static_cast<size_t>(n), 1.0f);
  std::vector<PushItem> items;
  for (int i = 0; i < n; ++i) {
    items.push_back(PushItem::Of<float>(c.small(i), std::span<const float>(&v[2 * i], 2)));
  }
  for (auto _ : state) {
    if (!c.client().Push(items).ok()) state.SkipWithError("push");
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_PushBatchOf8Bytes)->Arg(1)->Arg(16)->Arg(256)->UseRealTime();

// The coordinator placing ResNet-50's 161 tensors (4 MiB chunks) on 8 shards.
void BM_PlaceResNet50(benchmark::State& state) {
  // Sizes in bytes of the larger ResNet-50 tensors and many small ones.
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 53; ++i) sizes.push_back(4u << 20 >> (i % 6));
  for (int i = 0; i < 108; ++i) sizes.push_back(1024u << (i % 4));
  for (auto _ : state) {
    Placer p(PlacementPolicy::kGreedyBytes, 8);
    for (uint64_t b : sizes) benchmark::DoNotOptimize(p.Place(b));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(sizes.size()));
}
BENCHMARK(BM_PlaceResNet50);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
