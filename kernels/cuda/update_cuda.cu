// CUDA twins of kernels/cpu: the same arithmetic, one element per thread in
// a grid-stride loop, one fused kernel per rule. Hyper-parameters and bias
// corrections are computed on the host exactly as the CPU does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "gpu/cuda.h"
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
  return gpu::CudaStatus(static_cast<int>(err), what);
}

Status Launched(const char* what) { return Check(cudaGetLastError(), what); }

// --- element conversions (round to nearest even, as the CPU's) -------------

struct F16 {
  static __device__ float ToFloat(uint16_t x) { return __half2float(__ushort_as_half(x)); }
  static __device__ uint16_t FromFloat(float x) { return __half_as_ushort(__float2half_rn(x)); }
};
struct BF16 {
  static __device__ float ToFloat(uint16_t x) { return __bfloat162float(__ushort_as_bfloat16(x)); }
  static __device__ uint16_t FromFloat(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

// --- vector loads ------------------------------------------------------------

// V consecutive elements moved by one load or store. Each thread steps V
// elements at a time: 16-byte loads of the parameter's type (4 floats, 2
// doubles), and for f16/bf16 parameters 4 elements (8-byte loads of the
// halves, 16-byte loads of their f32 master and moments). Arrays not aligned
// to the pack, and the last n % V elements, go through V = 1.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T x[V];
};

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> Load(const T* p, size_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}
template <int V, typename T>
__device__ __forceinline__ void Store(T* p, size_t i, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = v;
}

bool Aligned(std::initializer_list<const void*> ptrs, size_t bytes) {
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % bytes != 0) return false;
  }
  return true;
}

// --- assign/add and the sync-step sum ----------------------------------------

// dst += src; n is a multiple of V.
template <typename T, int V>
__global__ void AddKernel(T* __restrict__ dst, const T* __restrict__ src, size_t n) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n / V; j += stride) {
    Pack<T, V> d = Load<V>(dst, j * V);
    const Pack<T, V> a = Load<V>(src, j * V);
#pragma unroll
    for (int e = 0; e < V; ++e) d.x[e] += a.x[e];
    Store(dst, j * V, d);
  }
}

template <typename T>
void LaunchAdd(T* dst, const T* src, size_t n, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const size_t head = Aligned({dst, src}, 16) ? n / V * V : 0;
  if (head > 0) AddKernel<T, V><<<Blocks(head / V), kThreads, 0, s>>>(dst, src, head);
  if (n > head)
    AddKernel<T, 1><<<Blocks(n - head), kThreads, 0, s>>>(dst + head, src + head, n - head);
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

// Host-side constants, computed as the CPU computes them.
template <typename T>
struct Consts {
  Params<T> k;
  T step_size, inv_sqrt_bc2, decay;
};

template <typename T>
Consts<T> MakeConsts(const Hyperparams& h, uint64_t step) {
  Consts<T> c;
  c.k = PrepareOptimizer<T>(h, step);
  c.step_size = c.k.lr / c.k.bc1;
  c.inv_sqrt_bc2 = T(1) / std::sqrt(c.k.bc2);
  c.decay = T(1) - c.k.lr * c.k.wd;
  return c;
}

template <UpdateRule R>
__host__ __device__ constexpr int Slots() {
  return R == UpdateRule::kAdam || R == UpdateRule::kAdamW ? 2 : R == UpdateRule::kSgd ? 0 : 1;
}

// One element of rule R, in the CPU's order of operations (--fmad=false keeps
// it: kernels/cpu gives the same bits).
template <UpdateRule R, typename T>
__device__ __forceinline__ void Step(T& p, T g, T& s0, T& s1, const Consts<T>& c) {
  const Params<T>& k = c.k;
  if constexpr (R == UpdateRule::kSgd) {
    p -= k.lr * (g + k.wd * p);
  } else if constexpr (R == UpdateRule::kMomentum) {
    if (k.nesterov) {
      T gi = g + k.wd * p;
      s0 = k.mu * s0 + gi;
      p -= k.lr * (gi + k.mu * s0);
    } else {
      s0 = k.mu * s0 + (g + k.wd * p);
      p -= k.lr * s0;
    }
  } else if constexpr (R == UpdateRule::kAdam || R == UpdateRule::kAdamW) {
    constexpr bool kDecoupled = R == UpdateRule::kAdamW;
    T gi = kDecoupled ? g : g + k.wd * p;
    if (kDecoupled) p *= c.decay;
    s0 = k.b1 * s0 + (T(1) - k.b1) * gi;
    s1 = k.b2 * s1 + (T(1) - k.b2) * gi * gi;
    p -= c.step_size * s0 / (sqrt(s1) * c.inv_sqrt_bc2 + k.eps);
  } else if constexpr (R == UpdateRule::kAdagrad) {
    T gi = g + k.wd * p;
    s0 += gi * gi;
    p -= k.lr * gi / (sqrt(s0) + k.eps);
  }
}

// The moments rule R keeps, V elements at i (rules without them touch nothing).
template <UpdateRule R, int V, typename T>
__device__ __forceinline__ void LoadSlots(const T* s0, const T* s1, size_t i, Pack<T, V>& a,
                                          Pack<T, V>& b) {
  if constexpr (Slots<R>() >= 1) a = Load<V>(s0, i);
  if constexpr (Slots<R>() >= 2) b = Load<V>(s1, i);
}
template <UpdateRule R, int V, typename T>
__device__ __forceinline__ void StoreSlots(T* s0, T* s1, size_t i, const Pack<T, V>& a,
                                           const Pack<T, V>& b) {
  if constexpr (Slots<R>() >= 1) Store(s0, i, a);
  if constexpr (Slots<R>() >= 2) Store(s1, i, b);
}

// One fused kernel per rule and type: n is a multiple of V here.
template <UpdateRule R, typename T, int V>
__global__ void OptimizerKernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ s0,
                                T* __restrict__ s1, size_t n, Consts<T> c) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n / V; j += stride) {
    const size_t i = j * V;
    Pack<T, V> pv = Load<V>(p, i), s0v{}, s1v{};
    const Pack<T, V> gv = Load<V>(g, i);
    LoadSlots<R>(s0, s1, i, s0v, s1v);
#pragma unroll
    for (int e = 0; e < V; ++e) Step<R>(pv.x[e], gv.x[e], s0v.x[e], s1v.x[e], c);
    Store(p, i, pv);
    StoreSlots<R>(s0, s1, i, s0v, s1v);
  }
}

// f16/bf16 parameters: the step runs on the f32 master copy, and the
// parameter is the master rounded.
template <UpdateRule R, typename H, int V>
__global__ void OptimizerHalfKernel(uint16_t* __restrict__ p, const uint16_t* __restrict__ g,
                                    float* __restrict__ master, float* __restrict__ s0,
                                    float* __restrict__ s1, size_t n, Consts<float> c) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n / V; j += stride) {
    const size_t i = j * V;
    Pack<float, V> mv = Load<V>(master, i), s0v{}, s1v{};
    const Pack<uint16_t, V> gv = Load<V>(g, i);
    Pack<uint16_t, V> pv;
    LoadSlots<R>(s0, s1, i, s0v, s1v);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      Step<R>(mv.x[e], H::ToFloat(gv.x[e]), s0v.x[e], s1v.x[e], c);
      pv.x[e] = H::FromFloat(mv.x[e]);
    }
    Store(master, i, mv);
    Store(p, i, pv);
    StoreSlots<R>(s0, s1, i, s0v, s1v);
  }
}

template <UpdateRule R, typename T>
Status LaunchRule(T* p, const T* g, T* s0, T* s1, size_t n, const Consts<T>& c, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const size_t head = Aligned({p, g, s0, s1}, sizeof(T) * V) ? n / V * V : 0;
  if (head > 0)
    OptimizerKernel<R, T, V><<<Blocks(head / V), kThreads, 0, s>>>(p, g, s0, s1, head, c);
  if (n > head) {
    OptimizerKernel<R, T, 1><<<Blocks(n - head), kThreads, 0, s>>>(
        p + head, g + head, s0 ? s0 + head : nullptr, s1 ? s1 + head : nullptr, n - head, c);
  }
  return Launched("optimizer kernel");
}

template <UpdateRule R, typename H>
Status LaunchHalfRule(uint16_t* p, const uint16_t* g, float* m, float* s0, float* s1, size_t n,
                      const Consts<float>& c, cudaStream_t s) {
  constexpr int V = 4;
  const size_t head = Aligned({p, g}, 2 * V) && Aligned({m, s0, s1}, 4 * V) ? n / V * V : 0;
  if (head > 0) {
    OptimizerHalfKernel<R, H, V><<<Blocks(head / V), kThreads, 0, s>>>(p, g, m, s0, s1, head, c);
  }
  if (n > head) {
    OptimizerHalfKernel<R, H, 1><<<Blocks(n - head), kThreads, 0, s>>>(
        p + head, g + head, m + head, s0 ? s0 + head : nullptr, s1 ? s1 + head : nullptr, n - head,
        c);
  }
  return Launched("optimizer kernel");
}

// The rule as a template argument: one kernel per rule, no branch on it per element.
template <typename Fn>
Status DispatchRule(UpdateRule rule, Fn&& fn) {
  switch (rule) {
    case UpdateRule::kSgd:
      return fn(std::integral_constant<UpdateRule, UpdateRule::kSgd>{});
    case UpdateRule::kMomentum:
      return fn(std::integral_constant<UpdateRule, UpdateRule::kMomentum>{});
    case UpdateRule::kAdam:
      return fn(std::integral_constant<UpdateRule, UpdateRule::kAdam>{});
    case UpdateRule::kAdamW:
      return fn(std::integral_constant<UpdateRule, UpdateRule::kAdamW>{});
    case UpdateRule::kAdagrad:
      return fn(std::integral_constant<UpdateRule, UpdateRule::kAdagrad>{});
    default:
      return Status::InvalidArgument("not an optimizer rule");
  }
}

template <typename T>
Status LaunchOptimizer(UpdateRule rule, const Hyperparams& h, T* p, const T* g, T* s0, T* s1,
                       size_t n, uint64_t step, cudaStream_t stream) {
  const Consts<T> c = MakeConsts<T>(h, step);
  return DispatchRule(
      rule, [&](auto r) { return LaunchRule<decltype(r)::value, T>(p, g, s0, s1, n, c, stream); });
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
      LaunchAdd(static_cast<float*>(dst), static_cast<const float*>(src), n, s);
      break;
    case DType::kF64:
      LaunchAdd(static_cast<double*>(dst), static_cast<const double*>(src), n, s);
      break;
    case DType::kI32:
      LaunchAdd(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), n, s);
      break;
    case DType::kI64:
      LaunchAdd(static_cast<unsigned long long*>(dst), static_cast<const unsigned long long*>(src),
                n, s);
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
      if (scale != 1.0)
        ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<double*>(acc), n, scale);
      break;
    case DType::kF32:
      if (scale != 1.0) {
        ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<float*>(acc), n,
                                                   static_cast<float>(scale));
      }
      break;
    case DType::kF16:
      RoundHalfKernel<F16><<<Blocks(n), kThreads, 0, s>>>(static_cast<const float*>(acc),
                                                          static_cast<uint16_t*>(out_half), n,
                                                          static_cast<float>(scale));
      break;
    case DType::kBF16:
      RoundHalfKernel<BF16><<<Blocks(n), kThreads, 0, s>>>(static_cast<const float*>(acc),
                                                           static_cast<uint16_t*>(out_half), n,
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
  TESSERA_RETURN_IF_ERROR(CheckOptimizerStep(rule, dtype, state, step));
  cudaStream_t s = AsStream(stream);
  switch (dtype) {
    case DType::kF64:
      return LaunchOptimizer<double>(
          rule, h, static_cast<double*>(param), static_cast<const double*>(grad),
          static_cast<double*>(state.slot0), static_cast<double*>(state.slot1), n, step, s);
    case DType::kF32:
      return LaunchOptimizer<float>(
          rule, h, static_cast<float*>(param), static_cast<const float*>(grad),
          static_cast<float*>(state.slot0), static_cast<float*>(state.slot1), n, step, s);
    case DType::kF16:
    case DType::kBF16: {
      if (!state.master) return Status::Internal("f16/bf16 parameter without its master copy");
      const Consts<float> c = MakeConsts<float>(h, step);
      auto* p = static_cast<uint16_t*>(param);
      const auto* g = static_cast<const uint16_t*>(grad);
      auto* s0 = static_cast<float*>(state.slot0);
      auto* s1 = static_cast<float*>(state.slot1);
      const bool f16 = dtype == DType::kF16;
      return DispatchRule(rule, [&](auto r) {
        constexpr UpdateRule R = decltype(r)::value;
        return f16 ? LaunchHalfRule<R, F16>(p, g, state.master, s0, s1, n, c, s)
                   : LaunchHalfRule<R, BF16>(p, g, state.master, s0, s1, n, c, s);
      });
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

}  // namespace tessera::kernels::cuda
