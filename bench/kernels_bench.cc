// Update kernels' bytes/s beside a memcpy of the same bytes, in one binary.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "kernels/update.h"

namespace tessera::kernels {
namespace {

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(64 << 20);

// add reads two buffers and writes one: 3 bytes of traffic per byte of tensor;
// bytes/s counts tensor bytes, so memcpy's figure (2 bytes of traffic) x 2/3
// is add's bandwidth bound.
void BM_AddF32(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 4;
  std::vector<float> dst(n, 1.0f), src(n, 0.5f);
  for (auto _ : state) {
    (void)ApplyUpdateCpu(UpdateRule::kAdd, DType::kF32, dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 4));
}
BENCHMARK(BM_AddF32)->Arg(1 << 20)->Arg(64 << 20);

void BM_AddBF16(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 2;
  std::vector<uint16_t> dst(n, FloatToBFloat16(1.0f)), src(n, FloatToBFloat16(0.5f));
  for (auto _ : state) {
    (void)ApplyUpdateCpu(UpdateRule::kAdd, DType::kBF16, dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 2));
}
BENCHMARK(BM_AddBF16)->Arg(1 << 20)->Arg(64 << 20);

}  // namespace
}  // namespace tessera::kernels

BENCHMARK_MAIN();
