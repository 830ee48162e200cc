// CUDA twins of kernels/cpu: the same arithmetic, one element per thread in
// a grid-stride loop, one fused kernel per rule. Hyper-parameters and bias
// corrections are computed on the host exactly as the CPU does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/optimizer_params.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 256;

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

int Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")");
}

Status Launched(const char* what) { return Check(cudaGetLastError(), what); }

// --- element conversions (round to nearest even, as the CPU's) -------------

struct F16 {
  static __device__ float ToFloat(uint16_t x) { return __half2float(__ushort_as_half(x)); }
  static __device__ uint16_t FromFloat(float x) { return __half_as_ushort(__float2half_rn(x)); }
};
struct BF16 {
  static __device__ float ToFloat(uint16_t x) {
    return __bfloat162float(__ushort_as_bfloat16(x));
  }
  static __device__ uint16_t FromFloat(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

// --- assign/add and the sync-step sum ----------------------------------------

template <typename T>
__global__ void AddKernel(T* __restrict__ dst, const T* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    dst[i] += src[i];
  }
}

template <typename H>
__global__ void AddHalfKernel(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src,
                              size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    dst[i] = H::FromFloat(H::ToFloat(dst[i]) + H::ToFloat(src[i]));
  }
}

template <typename H>
__global__ void AccumulateHalfKernel(float* __restrict__ acc, const uint16_t* __restrict__ g,
                                     size_t n, bool first) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    acc[i] = (first ? 0.0f : acc[i]) + H::ToFloat(g[i]);
  }
}

template <typename T>
__global__ void ScaleKernel(T* x, size_t n, T s) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    x[i] *= s;
  }
}

template <typename H>
__global__ void RoundHalfKernel(const float* __restrict__ acc, uint16_t* __restrict__ out, size_t n,
                                float scale) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    out[i] = H::FromFloat(acc[i] * scale);
  }
}

// --- optimizers ----------------------------------------------------------------

template <typename T>
using Params = OptimizerParams<T>;

// One element of one rule, in the CPU's order of operations.
template <typename T>
__device__ void StepOne(UpdateRule rule, T& p, T g, T* s0, T* s1, const Params<T>& k, T step_size,
                        T inv_sqrt_bc2, T decay) {
  switch (rule) {
    case UpdateRule::kSgd:
      p -= k.lr * (g + k.wd * p);
      return;
    case UpdateRule::kMomentum:
      if (k.nesterov) {
        T gi = g + k.wd * p;
        *s0 = k.mu * *s0 + gi;
        p -= k.lr * (gi + k.mu * *s0);
      } else {
        *s0 = k.mu * *s0 + (g + k.wd * p);
        p -= k.lr * *s0;
      }
      return;
    case UpdateRule::kAdam:
    case UpdateRule::kAdamW: {
      const bool decoupled = rule == UpdateRule::kAdamW;
      T gi = decoupled ? g : g + k.wd * p;
      if (decoupled) p *= decay;
      *s0 = k.b1 * *s0 + (T(1) - k.b1) * gi;
      *s1 = k.b2 * *s1 + (T(1) - k.b2) * gi * gi;
      p -= step_size * *s0 / (sqrt(*s1) * inv_sqrt_bc2 + k.eps);
      return;
    }
    case UpdateRule::kAdagrad: {
      T gi = g + k.wd * p;
      *s0 += gi * gi;
      p -= k.lr * gi / (sqrt(*s0) + k.eps);
      return;
    }
    default:
      return;
  }
}

template <typename T>
__global__ void OptimizerKernel(UpdateRule rule, T* __restrict__ p, const T* __restrict__ g,
                                T* __restrict__ s0, T* __restrict__ s1, size_t n, Params<T> k,
                                T step_size, T inv_sqrt_bc2, T decay) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    T pi = p[i];
    StepOne(rule, pi, g[i], s0 ? s0 + i : nullptr, s1 ? s1 + i : nullptr, k, step_size,
            inv_sqrt_bc2, decay);
    p[i] = pi;
  }
}

// f16/bf16 parameters: the step runs on the f32 master copy, and the
// parameter is the master rounded.
template <typename H>
__global__ void OptimizerHalfKernel(UpdateRule rule, uint16_t* __restrict__ p,
                                    const uint16_t* __restrict__ g, float* __restrict__ master,
                                    float* __restrict__ s0, float* __restrict__ s1, size_t n,
                                    Params<float> k, float step_size, float inv_sqrt_bc2,
                                    float decay) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    float mi = master[i];
    StepOne(rule, mi, H::ToFloat(g[i]), s0 ? s0 + i : nullptr, s1 ? s1 + i : nullptr, k, step_size,
            inv_sqrt_bc2, decay);
    master[i] = mi;
    p[i] = H::FromFloat(mi);
  }
}

template <typename T>
Status LaunchOptimizer(UpdateRule rule, const Hyperparams& h, T* p, const T* g, T* s0, T* s1,
                       size_t n, uint64_t step, cudaStream_t stream) {
  const auto k = PrepareOptimizer<T>(h, step);
  // The same host-side constants as the CPU's Adam.
  const T step_size = k.lr / k.bc1;
  const T inv_sqrt_bc2 = T(1) / std::sqrt(k.bc2);
  const T decay = T(1) - k.lr * k.wd;
  OptimizerKernel<T><<<Blocks(n), kThreads, 0, stream>>>(rule, p, g, s0, s1, n, k, step_size,
                                                         inv_sqrt_bc2, decay);
  return Launched("optimizer kernel");
}

}  // namespace

Status ApplyUpdate(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n,
                   void* stream) {
  cudaStream_t s = AsStream(stream);
  if (rule == UpdateRule::kAssign) {
    return Check(cudaMemcpyAsync(dst, src, n * DTypeSize(dtype), cudaMemcpyDeviceToDevice, s),
                 "assign (cudaMemcpyAsync)");
  }
  if (rule != UpdateRule::kAdd) return Status::InvalidArgument("unknown update rule");
  switch (dtype) {
    case DType::kF32:
      AddKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<float*>(dst),
                                               static_cast<const float*>(src), n);
      break;
    case DType::kF64:
      AddKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<double*>(dst),
                                               static_cast<const double*>(src), n);
      break;
    case DType::kI32:
      AddKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<uint32_t*>(dst),
                                               static_cast<const uint32_t*>(src), n);
      break;
    case DType::kI64:
      AddKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<unsigned long long*>(dst),
                                               static_cast<const unsigned long long*>(src), n);
      break;
    case DType::kF16:
      AddHalfKernel<F16><<<Blocks(n), kThreads, 0, s>>>(static_cast<uint16_t*>(dst),
                                                        static_cast<const uint16_t*>(src), n);
      break;
    case DType::kBF16:
      AddHalfKernel<BF16><<<Blocks(n), kThreads, 0, s>>>(static_cast<uint16_t*>(dst),
                                                         static_cast<const uint16_t*>(src), n);
      break;
  }
  return Launched("add kernel");
}

Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first, void* stream) {
  cudaStream_t s = AsStream(stream);
  if (dtype == DType::kF16 || dtype == DType::kBF16) {
    auto* a = static_cast<float*>(acc);
    const auto* g = static_cast<const uint16_t*>(grad);
    if (dtype == DType::kF16) {
      AccumulateHalfKernel<F16><<<Blocks(n), kThreads, 0, s>>>(a, g, n, first);
    } else {
      AccumulateHalfKernel<BF16><<<Blocks(n), kThreads, 0, s>>>(a, g, n, first);
    }
    return Launched("accumulate kernel");
  }
  return ApplyUpdate(first ? UpdateRule::kAssign : UpdateRule::kAdd, dtype, acc, grad, n, stream);
}

Status FinishAccumulation(DType dtype, void* acc, size_t n, double scale, void* out_half,
                          void* stream) {
  cudaStream_t s = AsStream(stream);
  switch (dtype) {
    case DType::kF64:
      if (scale != 1.0) ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<double*>(acc), n, scale);
      break;
    case DType::kF32:
      if (scale != 1.0) {
        ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<float*>(acc), n,
                                                   static_cast<float>(scale));
      }
      break;
    case DType::kF16:
      RoundHalfKernel<F16><<<Blocks(n), kThreads, 0, s>>>(
          static_cast<const float*>(acc), static_cast<uint16_t*>(out_half), n,
          static_cast<float>(scale));
      break;
    case DType::kBF16:
      RoundHalfKernel<BF16><<<Blocks(n), kThreads, 0, s>>>(
          static_cast<const float*>(acc), static_cast<uint16_t*>(out_half), n,
          static_cast<float>(scale));
      break;
    case DType::kI32:
    case DType::kI64:
      return Status::Ok();  // integers are summed, never averaged
  }
  return Launched("finish-accumulation kernel");
}

Status ApplyOptimizer(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                      const void* grad, size_t n, const RuleState& state, uint64_t step,
                      void* stream) {
  TESSERA_RETURN_IF_ERROR(CheckRule(rule, dtype));
  if (!IsOptimizer(rule)) return Status::InvalidArgument("not an optimizer rule");
  if (step == 0) return Status::InvalidArgument("optimizer steps count from 1");
  const int slots = StateSlots(rule);
  if ((slots >= 1 && !state.slot0) || (slots >= 2 && !state.slot1)) {
    return Status::Internal(std::string("rule ") + UpdateRuleName(rule) + " has no state buffers");
  }
  cudaStream_t s = AsStream(stream);
  switch (dtype) {
    case DType::kF64:
      return LaunchOptimizer<double>(rule, h, static_cast<double*>(param),
                                     static_cast<const double*>(grad),
                                     static_cast<double*>(state.slot0),
                                     static_cast<double*>(state.slot1), n, step, s);
    case DType::kF32:
      return LaunchOptimizer<float>(rule, h, static_cast<float*>(param),
                                    static_cast<const float*>(grad),
                                    static_cast<float*>(state.slot0),
                                    static_cast<float*>(state.slot1), n, step, s);
    case DType::kF16:
    case DType::kBF16: {
      if (!state.master) return Status::Internal("f16/bf16 parameter without its master copy");
      const auto k = PrepareOptimizer<float>(h, step);
      const float step_size = k.lr / k.bc1;
      const float inv_sqrt_bc2 = 1.0f / std::sqrt(k.bc2);
      const float decay = 1.0f - k.lr * k.wd;
      auto* p = static_cast<uint16_t*>(param);
      const auto* g = static_cast<const uint16_t*>(grad);
      auto* s0 = static_cast<float*>(state.slot0);
      auto* s1 = static_cast<float*>(state.slot1);
      if (dtype == DType::kF16) {
        OptimizerHalfKernel<F16><<<Blocks(n), kThreads, 0, s>>>(
            rule, p, g, state.master, s0, s1, n, k, step_size, inv_sqrt_bc2, decay);
      } else {
        OptimizerHalfKernel<BF16><<<Blocks(n), kThreads, 0, s>>>(
            rule, p, g, state.master, s0, s1, n, k, step_size, inv_sqrt_bc2, decay);
      }
      return Launched("optimizer kernel");
    }
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return Status::InvalidArgument("unsupported dtype");
}

Status Synchronize(void* stream) {
  return Check(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

Status DeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: it is an answer, not a failure of later calls
    return Status::Unavailable(std::string("no usable GPU: cudaGetDeviceCount returned ") +
                               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  if (count == 0) return Status::Unavailable("no usable GPU: cudaGetDeviceCount found none");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
