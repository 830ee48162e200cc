// The CUDA kernels against the CPU ones: the same inputs, three steps of every
// rule on every dtype, and the results must be the same bits (both do IEEE
// operations in the same order, without contraction). Where no GPU can be
// used, the GPU cases skip and say why; the probe itself is tested everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gpu/cuda.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/update.h"

namespace tessera::kernels {
namespace {

// Without a usable GPU the probe says so, naming CUDA's error; it never crashes.
TEST(CudaDevice, AvailableOrSaysWhy) {
  Status st = gpu::Available();
  if (st.ok()) {
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    EXPECT_GT(count, 0);
    return;
  }
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("no usable GPU"), std::string::npos) << st.ToString();
  // A second probe answers the same (the first error was cleared, not sticky).
  EXPECT_EQ(gpu::Available().message(), st.message());
}

// `bytes` of device memory starting `skew` bytes into an allocation, so that
// a case can hand the kernels arrays that are not 16-byte aligned.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, size_t skew = 0) : bytes_(bytes), skew_(skew) {
    if (bytes_ > 0 && cudaMalloc(&base_, bytes_ + skew_) != cudaSuccess) base_ = nullptr;
  }
  ~DeviceBuffer() {
    if (base_) cudaFree(base_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return base_ ? static_cast<uint8_t*>(base_) + skew_ : nullptr; }
  void Upload(const void* host) {
    ASSERT_EQ(cudaMemcpy(get(), host, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(bytes_);
    EXPECT_EQ(cudaMemcpy(out.data(), get(), bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_, skew_;
};

struct Case {
  UpdateRule rule;
  DType dtype;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(UpdateRuleName(info.param.rule)) + "_" + DTypeName(info.param.dtype);
}

// Values of `dtype` near 1 and small gradients, as the CPU tests use.
std::vector<uint8_t> Values(DType dtype, size_t n, uint32_t seed, double scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  for (size_t i = 0; i < n; ++i)
    StoreAs(dtype, scale * dist(rng), out.data() + i * DTypeSize(dtype));
  return out;
}

class CudaKernelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    Status st = gpu::Available();
    if (!st.ok()) GTEST_SKIP() << st.message();
  }
};

// Three steps on the GPU and on the CPU: the same bits. `skew`: the GPU's
// arrays start that many elements past an aligned address (the kernels'
// unaligned path instead of their vector loads).
void ThreeStepsMatchTheCpu(UpdateRule rule, DType dtype, size_t skew) {
  constexpr size_t n = 10007;  // not a multiple of any block size or vector width
  const size_t bytes = n * DTypeSize(dtype);
  Hyperparams h;
  h.learning_rate = 0.05f;
  h.weight_decay = 0.01f;
  h.momentum = 0.9f;
  h.nesterov = true;
  h.initial_accumulator = 0.1f;
  std::vector<uint8_t> cpu_param = Values(dtype, n, 1, 1.0);
  DeviceBuffer param(bytes, skew * DTypeSize(dtype)), grad(bytes, skew * DTypeSize(dtype));
  param.Upload(cpu_param.data());

  // State on both sides.
  const bool optimizer = IsOptimizer(rule);
  const size_t state_bytes = n * StateElementSize(dtype);
  std::vector<uint8_t> s0(state_bytes), s1(state_bytes);
  std::vector<float> master(NeedsMaster(dtype, rule) ? n : 0);
  RuleState cpu_state;
  if (StateSlots(rule) >= 1) cpu_state.slot0 = s0.data();
  if (StateSlots(rule) >= 2) cpu_state.slot1 = s1.data();
  if (!master.empty()) cpu_state.master = master.data();
  if (optimizer) {
    ASSERT_TRUE(ResetRuleState(rule, h, dtype, cpu_param.data(), n, cpu_state).ok());
  }
  const size_t state_skew = skew * StateElementSize(dtype);
  DeviceBuffer d0(state_bytes, state_skew), d1(state_bytes, state_skew),
      dmaster(master.size() * 4, skew * 4);
  d0.Upload(s0.data());
  d1.Upload(s1.data());
  if (!master.empty()) dmaster.Upload(master.data());
  RuleState gpu_state;
  if (cpu_state.slot0) gpu_state.slot0 = d0.get();
  if (cpu_state.slot1) gpu_state.slot1 = d1.get();
  if (cpu_state.master) gpu_state.master = static_cast<float*>(dmaster.get());

  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<uint8_t> g = Values(dtype, n, 100 + static_cast<uint32_t>(step), 0.1);
    grad.Upload(g.data());
    if (optimizer) {
      ASSERT_TRUE(
          ApplyOptimizerCpu(rule, h, dtype, cpu_param.data(), g.data(), n, cpu_state, step).ok());
      ASSERT_TRUE(
          cuda::ApplyOptimizer(rule, h, dtype, param.get(), grad.get(), n, gpu_state, step, nullptr)
              .ok());
    } else {
      ASSERT_TRUE(ApplyUpdateCpu(rule, dtype, cpu_param.data(), g.data(), n).ok());
      ASSERT_TRUE(cuda::ApplyUpdate(rule, dtype, param.get(), grad.get(), n, nullptr).ok());
    }
    ASSERT_TRUE(cuda::Synchronize(nullptr).ok());
  }
  EXPECT_TRUE(param.Download() == cpu_param) << "parameters differ from the CPU's";
  if (cpu_state.slot0) {
    EXPECT_TRUE(d0.Download() == s0) << "first state slot differs";
  }
  if (cpu_state.slot1) {
    EXPECT_TRUE(d1.Download() == s1) << "second state slot differs";
  }
  if (cpu_state.master) {
    auto got = dmaster.Download();
    EXPECT_EQ(std::memcmp(got.data(), master.data(), got.size()), 0) << "master copy differs";
  }
}

TEST_P(CudaKernelTest, ThreeStepsMatchTheCpuBitForBit) {
  ThreeStepsMatchTheCpu(GetParam().rule, GetParam().dtype, 0);
}

TEST_P(CudaKernelTest, UnalignedArraysMatchTheCpuBitForBit) {
  ThreeStepsMatchTheCpu(GetParam().rule, GetParam().dtype, 1);
}

// The sync-step sum of 4 gradients, averaged, as the shard does it.
TEST_P(CudaKernelTest, AveragedSumMatchesTheCpu) {
  const DType dtype = GetParam().dtype;
  if (GetParam().rule != UpdateRule::kAdd) GTEST_SKIP() << "once per dtype (the add cases)";
  constexpr size_t n = 4099;
  const size_t acc_bytes = n * AccumulatorElementSize(dtype);
  std::vector<uint8_t> acc(acc_bytes);
  DeviceBuffer dacc(acc_bytes), dgrad(n * DTypeSize(dtype)), dout(n * 2);
  for (int w = 0; w < 4; ++w) {
    auto g = Values(dtype, n, 7 + static_cast<uint32_t>(w), 1.0);
    ASSERT_TRUE(Accumulate(dtype, acc.data(), g.data(), n, w == 0).ok());
    dgrad.Upload(g.data());
    ASSERT_TRUE(cuda::Accumulate(dtype, dacc.get(), dgrad.get(), n, w == 0, nullptr).ok());
    ASSERT_TRUE(cuda::Synchronize(nullptr).ok());
  }
  std::vector<uint8_t> rounded;
  const void* cpu = FinishAccumulation(dtype, acc.data(), n, 0.25, &rounded);
  ASSERT_TRUE(cuda::FinishAccumulation(dtype, dacc.get(), n, 0.25, dout.get(), nullptr).ok());
  ASSERT_TRUE(cuda::Synchronize(nullptr).ok());
  const bool half = dtype == DType::kF16 || dtype == DType::kBF16;
  auto got = half ? dout.Download() : dacc.Download();
  EXPECT_EQ(std::memcmp(got.data(), cpu, half ? n * 2 : acc_bytes), 0);
}

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (UpdateRule r :
         {UpdateRule::kAssign, UpdateRule::kAdd, UpdateRule::kSgd, UpdateRule::kMomentum,
          UpdateRule::kAdam, UpdateRule::kAdamW, UpdateRule::kAdagrad}) {
      out.push_back({r, d});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Rules, CudaKernelTest, ::testing::ValuesIn(AllCases()), Name);

}  // namespace
}  // namespace tessera::kernels
