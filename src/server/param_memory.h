// Where a shard keeps its parameters' optimizer state and step sums, and the
// kernels that update parameters there: host memory with the CPU kernels, or
// one GPU with the CUDA kernels on the shard's own stream. The shard calls it
// from its progress thread only; every call has finished when it returns.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/update.h"
#include "tessera/status.h"
#include "tessera/tensor.h"
#include "transport/transport.h"

namespace tessera::server {

// "host", "cuda" (GPU 0) or "cuda:N".
struct MemorySpec {
  transport::MemoryKind kind = transport::MemoryKind::kHost;
  int device = 0;
  std::string ToString() const;
};
Result<MemorySpec> ParseMemorySpec(const std::string& text);

// Memory owned by a ParamMemory: host bytes or a GPU allocation.
class StateBuffer {
 public:
  StateBuffer() = default;
  StateBuffer(std::shared_ptr<void> owner, void* data, size_t size)
      : owner_(std::move(owner)), data_(static_cast<uint8_t*>(data)), size_(size) {}
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }

 private:
  std::shared_ptr<void> owner_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class ParamMemory {
 public:
  // Host memory always opens; a GPU only where CUDA can use it (else the
  // error says why, e.g. no driver).
  static Result<std::unique_ptr<ParamMemory>> Open(const MemorySpec& spec);
  virtual ~ParamMemory() = default;

  virtual const MemorySpec& spec() const = 0;
  bool is_host() const { return spec().kind == transport::MemoryKind::kHost; }
  // "host memory", "NVIDIA H200 (device 0, ...)".
  virtual std::string Describe() const = 0;
  // Makes this memory's GPU current on the calling thread, for allocations
  // made elsewhere (the transport's Allocate) to land on it.
  virtual Status MakeCurrent() = 0;

  // Bytes of this memory free now (host: available to this process).
  virtual Result<uint64_t> FreeBytes() = 0;
  // Zero-filled memory of this kind.
  virtual Result<StateBuffer> Allocate(size_t bytes) = 0;
  virtual Status Zero(void* dst, size_t bytes) = 0;
  // Copies between this memory and the host.
  virtual Status ToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual Status FromHost(void* dst, const void* host_src, size_t bytes) = 0;
  // Bytes in host memory (an inline push, a host staging slot) where this
  // memory's kernels can read them: the bytes themselves, or a copy on the
  // GPU that is valid until the next call.
  virtual Result<const void*> Reachable(const void* host, size_t bytes) = 0;

  // The kernels/ interface, on this memory.
  virtual Status ApplyUpdate(UpdateRule rule, DType dtype, void* dst, const void* src,
                             size_t n) = 0;
  virtual Status ApplyOptimizer(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                                const void* grad, size_t n, const kernels::RuleState& state,
                                uint64_t step) = 0;
  virtual Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first) = 0;
  // The finished sum as a gradient of `dtype`: acc itself, or (f16/bf16) a
  // rounded copy valid until the next call.
  virtual Result<const void*> FinishAccumulation(DType dtype, void* acc, size_t n,
                                                 double scale) = 0;
  virtual Status ResetRuleState(UpdateRule rule, const Hyperparams& h, DType dtype,
                                const void* param, size_t n, const kernels::RuleState& state) = 0;
};

// The GPU implementation (param_memory_cuda.cc, in builds with CUDA).
Result<std::unique_ptr<ParamMemory>> OpenCudaParamMemory(const MemorySpec& spec);

}  // namespace tessera::server
