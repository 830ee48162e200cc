// Update kernels' bytes/s beside a memcpy of the same bytes, in one binary.
// Each benchmark also reports "traffic": the bytes it must read and write per
// second (memcpy: 2 per byte; add and SGD: 3; Adam: 7; summing W gradients:
// 3 per gradient byte). A kernel's traffic over memcpy's is how close it runs
// to the memory bandwidth bound (the target is 0.6 or more).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/halves_cpu.h"
#include "kernels/update.h"

namespace tessera::kernels {
namespace {

void Traffic(benchmark::State& state, double bytes_per_iteration) {
  state.counters["traffic"] =
      benchmark::Counter(bytes_per_iteration * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  Traffic(state, 2.0 * static_cast<double>(bytes));
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
  Traffic(state, 3.0 * static_cast<double>(n * 4));
}
BENCHMARK(BM_AddF32)->Arg(1 << 20)->Arg(64 << 20);

// A sync step's sum of W = 4 workers' gradients into the f32 accumulator.
void BM_SumOf4GradientsF32(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 4;
  std::vector<float> acc(n), g0(n, 1.0f), g1(n, 2.0f), g2(n, 3.0f), g3(n, 4.0f);
  for (auto _ : state) {
    (void)Accumulate(DType::kF32, acc.data(), g0.data(), n, true);
    (void)Accumulate(DType::kF32, acc.data(), g1.data(), n, false);
    (void)Accumulate(DType::kF32, acc.data(), g2.data(), n, false);
    (void)Accumulate(DType::kF32, acc.data(), g3.data(), n, false);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(4 * n * 4));
  Traffic(state, (2.0 + 3.0 * 3) * static_cast<double>(n * 4));
}
BENCHMARK(BM_SumOf4GradientsF32)->Arg(1 << 20)->Arg(64 << 20);

template <UpdateRule kRule>
void BM_OptimizerF32(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 4;
  std::vector<float> p(n, 1.0f), g(n, 0.01f), m(n), v(n);
  Hyperparams h;
  h.weight_decay = 0.01f;
  RuleState st{m.data(), v.data(), nullptr};
  uint64_t step = 0;
  for (auto _ : state) {
    (void)ApplyOptimizerCpu(kRule, h, DType::kF32, p.data(), g.data(), n, st, ++step);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 4));
  const double streams = kRule == UpdateRule::kSgd ? 3.0 : 7.0;  // Adam: p, g, m, v in; p, m, v out
  Traffic(state, streams * static_cast<double>(n * 4));
}
BENCHMARK(BM_OptimizerF32<UpdateRule::kSgd>)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_OptimizerF32<UpdateRule::kAdam>)->Arg(1 << 20)->Arg(64 << 20);

// The f16/bf16 kernels (kernels/cpu/halves_cpu.h): traffic counts the
// tensor's own bytes, as for f32, so their ratio to memcpy's is comparable.
uint16_t Half(DType dtype, float x) {
  return dtype == DType::kF16 ? FloatToHalf(x) : FloatToBFloat16(x);
}

template <DType kDType>
void BM_AddHalf(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 2;
  std::vector<uint16_t> dst(n, Half(kDType, 1.0f)), src(n, Half(kDType, 0.0f));
  for (auto _ : state) {
    (void)ApplyUpdateCpu(UpdateRule::kAdd, kDType, dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 2));
  Traffic(state, 3.0 * static_cast<double>(n * 2));
}
BENCHMARK(BM_AddHalf<DType::kBF16>)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_AddHalf<DType::kF16>)->Arg(1 << 20)->Arg(64 << 20);

// Each half add path this CPU can run (0 scalar, 1 AVX2, 2 AVX-512), side by
// side in one run: what the widest one gains.
template <DType kDType>
void BM_AddHalfPath(benchmark::State& state) {
  const auto path = static_cast<kernels::HalfAddPath>(state.range(1));
  if (!kernels::CanRun(path, kDType)) {
    state.SkipWithError("this CPU cannot run this path");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(0)) / 2;
  std::vector<uint16_t> dst(n, Half(kDType, 1.0f)), src(n, Half(kDType, 0.0f));
  for (auto _ : state) {
    kernels::AddHalvesUsing(path, kDType, dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 2));
  Traffic(state, 3.0 * static_cast<double>(n * 2));
}
BENCHMARK(BM_AddHalfPath<DType::kBF16>)->ArgsProduct({{1 << 20, 64 << 20}, {0, 1, 2}});
BENCHMARK(BM_AddHalfPath<DType::kF16>)->ArgsProduct({{1 << 20, 64 << 20}, {0, 1, 2}});

// A sync step's sum of 4 half gradients into the f32 accumulator, and the
// average rounded back to a half gradient: gradients in (2 bytes each),
// the accumulator written once and read and written three times (4 bytes),
// the result out (2 bytes).
template <DType kDType>
void BM_SumOf4GradientsHalf(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 2;
  std::vector<float> acc(n);
  std::vector<uint16_t> g(4 * n, Half(kDType, 0.25f));
  std::vector<uint8_t> out;
  for (auto _ : state) {
    for (size_t w = 0; w < 4; ++w) (void)Accumulate(kDType, acc.data(), &g[w * n], n, w == 0);
    FinishAccumulation(kDType, acc.data(), n, 0.25, &out);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(4 * n * 2));
  Traffic(state, (4 * 2.0 + 4.0 + 3 * 8.0 + 4.0 + 2.0) * static_cast<double>(n));
}
BENCHMARK(BM_SumOf4GradientsHalf<DType::kBF16>)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_SumOf4GradientsHalf<DType::kF16>)->Arg(1 << 20)->Arg(64 << 20);

// Adam on a half parameter through its f32 master: p and g in (2 bytes),
// master, m and v in and out (4 bytes), p out (2 bytes).
template <DType kDType>
void BM_AdamHalf(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / 2;
  std::vector<uint16_t> p(n, Half(kDType, 1.0f)), g(n, Half(kDType, 0.01f));
  std::vector<float> master(n, 1.0f), m(n), v(n);
  Hyperparams h;
  RuleState st{m.data(), v.data(), master.data()};
  uint64_t step = 0;
  for (auto _ : state) {
    (void)ApplyOptimizerCpu(UpdateRule::kAdam, h, kDType, p.data(), g.data(), n, st, ++step);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 2));
  Traffic(state, (2.0 + 3 * 8.0 + 2.0) * static_cast<double>(n));
}
BENCHMARK(BM_AdamHalf<DType::kBF16>)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_AdamHalf<DType::kF16>)->Arg(1 << 20)->Arg(64 << 20);

}  // namespace
}  // namespace tessera::kernels

BENCHMARK_MAIN();
