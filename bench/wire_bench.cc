// Encode/decode cost of the control messages on the hot path, by batch size.
#include <benchmark/benchmark.h>

#include "wire/messages.h"

namespace tessera::wire {
namespace {

Push MakePush(int entries) {
  Push p;
  for (int i = 0; i < entries; ++i) p.entries.push_back({static_cast<uint32_t>(i), 64u * i, 4096});
  return p;
}

void BM_EncodePush(benchmark::State& state) {
  Push p = MakePush(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(Encode(p, 1));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_EncodePush)->Arg(1)->Arg(16)->Arg(256);

void BM_DecodePush(benchmark::State& state) {
  auto frame = Encode(MakePush(static_cast<int>(state.range(0))), 1);
  for (auto _ : state) benchmark::DoNotOptimize(Decode<Push>(frame));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_DecodePush)->Arg(1)->Arg(16)->Arg(256);

}  // namespace
}  // namespace tessera::wire

BENCHMARK_MAIN();
