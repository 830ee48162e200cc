// ParamMemory on one GPU: plain cudaMalloc'd state, the CUDA kernels on one
// stream (the shard's progress thread is its only user), each call
// synchronised before it returns so that its error is the call's.
#include <cstring>
#include <vector>

#include "gpu/cuda.h"
#include "kernels/cuda/kernels_cuda.h"
#include "server/param_memory.h"

namespace tessera::server {
namespace {

class CudaParamMemory final : public ParamMemory {
 public:
  CudaParamMemory(MemorySpec spec, gpu::Stream stream, std::string name)
      : spec_(spec), stream_(std::move(stream)), name_(std::move(name)) {}

  const MemorySpec& spec() const override { return spec_; }
  std::string Describe() const override { return name_; }
  Status MakeCurrent() override { return gpu::SetDevice(spec_.device); }
  Result<uint64_t> FreeBytes() override { return gpu::FreeDeviceMemory(spec_.device); }

  Result<StateBuffer> Allocate(size_t bytes) override {
    auto buffer = gpu::DeviceBuffer::Allocate(bytes, spec_.device);
    if (!buffer.ok()) return buffer.status();
    auto owner = std::make_shared<gpu::DeviceBuffer>(std::move(*buffer));
    void* data = owner->data();
    TESSERA_RETURN_IF_ERROR(Zero(data, bytes));
    return StateBuffer(std::move(owner), data, bytes);
  }
  Status Zero(void* dst, size_t bytes) override {
    TESSERA_RETURN_IF_ERROR(gpu::Zero(dst, bytes, stream_));
    return stream_.Synchronize();
  }
  Status ToHost(void* host_dst, const void* src, size_t bytes) override {
    TESSERA_RETURN_IF_ERROR(gpu::Copy(host_dst, src, bytes, stream_));
    return stream_.Synchronize();
  }
  Status FromHost(void* dst, const void* host_src, size_t bytes) override {
    TESSERA_RETURN_IF_ERROR(gpu::Copy(dst, host_src, bytes, stream_));
    return stream_.Synchronize();
  }
  Result<const void*> Reachable(const void* host, size_t bytes) override {
    if (gpu::QueryPointer(host).device) return host;  // a GPU staging slot
    TESSERA_RETURN_IF_ERROR(Grow(&incoming_, bytes));
    TESSERA_RETURN_IF_ERROR(FromHost(incoming_.data(), host, bytes));
    return static_cast<const void*>(incoming_.data());
  }

  Status ApplyUpdate(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n) override {
    TESSERA_RETURN_IF_ERROR(kernels::cuda::ApplyUpdate(rule, dtype, dst, src, n, stream_.handle()));
    return kernels::cuda::Synchronize(stream_.handle());
  }
  Status ApplyOptimizer(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                        const void* grad, size_t n, const kernels::RuleState& state,
                        uint64_t step) override {
    TESSERA_RETURN_IF_ERROR(kernels::cuda::ApplyOptimizer(rule, h, dtype, param, grad, n, state,
                                                          step, stream_.handle()));
    return kernels::cuda::Synchronize(stream_.handle());
  }
  Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first) override {
    TESSERA_RETURN_IF_ERROR(
        kernels::cuda::Accumulate(dtype, acc, grad, n, first, stream_.handle()));
    return kernels::cuda::Synchronize(stream_.handle());
  }
  Result<const void*> FinishAccumulation(DType dtype, void* acc, size_t n, double scale) override {
    const bool half = dtype == DType::kF16 || dtype == DType::kBF16;
    if (half) TESSERA_RETURN_IF_ERROR(Grow(&rounded_, n * 2));
    TESSERA_RETURN_IF_ERROR(kernels::cuda::FinishAccumulation(
        dtype, acc, n, scale, half ? rounded_.data() : nullptr, stream_.handle()));
    TESSERA_RETURN_IF_ERROR(kernels::cuda::Synchronize(stream_.handle()));
    return half ? static_cast<const void*>(rounded_.data()) : static_cast<const void*>(acc);
  }
  // Once per initialisation or restore, not per step: done by the CPU's
  // code on a host copy, so that both memories start from the same state.
  Status ResetRuleState(UpdateRule rule, const Hyperparams& h, DType dtype, const void* param,
                        size_t n, const kernels::RuleState& state) override {
    const size_t state_bytes = n * kernels::StateElementSize(dtype);
    const int slots = kernels::StateSlots(rule);
    std::vector<uint8_t> p(n * DTypeSize(dtype)), s0(slots >= 1 ? state_bytes : 0),
        s1(slots >= 2 ? state_bytes : 0);
    std::vector<float> master(state.master != nullptr ? n : 0);
    TESSERA_RETURN_IF_ERROR(ToHost(p.data(), param, p.size()));
    kernels::RuleState host{s0.empty() ? nullptr : s0.data(), s1.empty() ? nullptr : s1.data(),
                            master.empty() ? nullptr : master.data()};
    TESSERA_RETURN_IF_ERROR(kernels::ResetRuleState(rule, h, dtype, p.data(), n, host));
    if (!s0.empty()) TESSERA_RETURN_IF_ERROR(FromHost(state.slot0, s0.data(), s0.size()));
    if (!s1.empty()) TESSERA_RETURN_IF_ERROR(FromHost(state.slot1, s1.data(), s1.size()));
    if (!master.empty()) {
      TESSERA_RETURN_IF_ERROR(FromHost(state.master, master.data(), master.size() * 4));
    }
    return Status::Ok();
  }

 private:
  Status Grow(gpu::DeviceBuffer* buffer, size_t bytes) {
    if (buffer->size() >= bytes) return Status::Ok();
    auto bigger = gpu::DeviceBuffer::Allocate(bytes, spec_.device);
    if (!bigger.ok()) return bigger.status();
    *buffer = std::move(*bigger);
    return Status::Ok();
  }

  MemorySpec spec_;
  gpu::Stream stream_;
  std::string name_;
  gpu::DeviceBuffer incoming_;  // Reachable's copies
  gpu::DeviceBuffer rounded_;   // FinishAccumulation's f16/bf16 result
};

}  // namespace

Result<std::unique_ptr<ParamMemory>> OpenCudaParamMemory(const MemorySpec& spec) {
  auto name = gpu::DescribeDevice(spec.device);
  if (!name.ok()) return name.status().WithContext("memory " + spec.ToString());
  auto stream = gpu::Stream::Create(spec.device);
  if (!stream.ok()) return stream.status().WithContext("memory " + spec.ToString());
  return std::unique_ptr<ParamMemory>(new CudaParamMemory(spec, std::move(*stream), *name));
}

}  // namespace tessera::server
