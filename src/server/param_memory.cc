#include "server/param_memory.h"

#include <cstring>
#include <memory>

#include "core/host_memory.h"
#include "gpu/cuda.h"
#include "tessera_config.h"

namespace tessera::server {
namespace {

class HostParamMemory final : public ParamMemory {
 public:
  const MemorySpec& spec() const override { return spec_; }
  std::string Describe() const override { return "host memory"; }
  Status MakeCurrent() override { return Status::Ok(); }
  Result<uint64_t> FreeBytes() override { return AvailableHostMemory(); }

  Result<StateBuffer> Allocate(size_t bytes) override {
    std::shared_ptr<uint8_t[]> owner(new (std::nothrow) uint8_t[bytes == 0 ? 1 : bytes]());
    if (!owner) return Status::ResourceExhausted("allocating " + std::to_string(bytes) + " bytes");
    uint8_t* data = owner.get();
    return StateBuffer(std::move(owner), data, bytes);
  }
  Status Zero(void* dst, size_t bytes) override {
    std::memset(dst, 0, bytes);
    return Status::Ok();
  }
  Status ToHost(void* host_dst, const void* src, size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
    return Status::Ok();
  }
  Status FromHost(void* dst, const void* host_src, size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
    return Status::Ok();
  }
  Result<const void*> Reachable(const void* host, size_t) override { return host; }

  Status ApplyUpdate(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n) override {
    return kernels::ApplyUpdateCpu(rule, dtype, dst, src, n);
  }
  Status ApplyOptimizer(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                        const void* grad, size_t n, const kernels::RuleState& state,
                        uint64_t step) override {
    return kernels::ApplyOptimizerCpu(rule, h, dtype, param, grad, n, state, step);
  }
  Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first) override {
    return kernels::Accumulate(dtype, acc, grad, n, first);
  }
  Result<const void*> FinishAccumulation(DType dtype, void* acc, size_t n, double scale) override {
    return kernels::FinishAccumulation(dtype, acc, n, scale, &rounded_);
  }
  Status ResetRuleState(UpdateRule rule, const Hyperparams& h, DType dtype, const void* param,
                        size_t n, const kernels::RuleState& state) override {
    return kernels::ResetRuleState(rule, h, dtype, param, n, state);
  }

 private:
  MemorySpec spec_;
  std::vector<uint8_t> rounded_;  // FinishAccumulation's f16/bf16 result
};

}  // namespace

std::string MemorySpec::ToString() const {
  return kind == transport::MemoryKind::kHost ? "host" : "cuda:" + std::to_string(device);
}

Result<MemorySpec> ParseMemorySpec(const std::string& text) {
  MemorySpec spec;
  if (text == "host") return spec;
  spec.kind = transport::MemoryKind::kCuda;
  if (text == "cuda") return spec;
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    spec.device = std::stoi(text.substr(5));
    return spec;
  }
  return Status::InvalidArgument("memory '" + text +
                                 "': expected host, cuda or cuda:N (a GPU index)");
}

#if !TESSERA_HAVE_CUDA
Result<std::unique_ptr<ParamMemory>> OpenCudaParamMemory(const MemorySpec& spec) {
  return gpu::Available().WithContext("memory " + spec.ToString());
}
#endif

Result<std::unique_ptr<ParamMemory>> ParamMemory::Open(const MemorySpec& spec) {
  if (spec.kind == transport::MemoryKind::kHost) {
    return std::unique_ptr<ParamMemory>(std::make_unique<HostParamMemory>());
  }
  return OpenCudaParamMemory(spec);
}

}  // namespace tessera::server
