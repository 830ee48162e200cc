// The optimizer rules on the CPU. Each rule is one loop over plain arrays of
// the compute type (f32, or f64 for f64 parameters) that the compiler
// vectorises; f16/bf16 parameters are updated through their f32 master copy,
// a block at a time.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cpu/halves_cpu.h"
#include "kernels/cpu/optimizer_loops.h"
#include "kernels/optimizer_params.h"
#include "kernels/update.h"

namespace tessera::kernels {
namespace {

// Adam and Adagrad spend their time in square roots and divides, not in
// memory: f32 gets copies built for wider vector units, chosen at load time
// by the CPU it runs on (GCC function multiversioning). The kernels library
// is built with -ffp-contract=off, so every copy gives the same bits.
// ThreadSanitizer instruments the clones' resolver, which the dynamic loader
// runs before TSan's runtime is up (a crash at load): one copy there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TESSERA_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TESSERA_WIDE_CLONES
#endif

TESSERA_WIDE_CLONES void AdamF32(float* p, const float* g, float* m, float* v, size_t n,
                                 const Params<float>& k) {
  Adam<float, false>(p, g, m, v, n, k);
}
TESSERA_WIDE_CLONES void AdamWF32(float* p, const float* g, float* m, float* v, size_t n,
                                  const Params<float>& k) {
  Adam<float, true>(p, g, m, v, n, k);
}
TESSERA_WIDE_CLONES void AdagradF32(float* p, const float* g, float* a, size_t n,
                                    const Params<float>& k) {
  Adagrad<float>(p, g, a, n, k);
}

template <typename T>
void Step(UpdateRule rule, T* p, const T* g, T* s0, T* s1, size_t n, const Params<T>& k) {
  if constexpr (std::is_same_v<T, float>) {
    if (rule == UpdateRule::kAdam) return AdamF32(p, g, s0, s1, n, k);
    if (rule == UpdateRule::kAdamW) return AdamWF32(p, g, s0, s1, n, k);
    if (rule == UpdateRule::kAdagrad) return AdagradF32(p, g, s0, n, k);
  }
  switch (rule) {
    case UpdateRule::kSgd:
      return Sgd(p, g, n, k);
    case UpdateRule::kMomentum:
      return Momentum(p, g, s0, n, k);
    case UpdateRule::kAdam:
      return Adam<T, false>(p, g, s0, s1, n, k);
    case UpdateRule::kAdamW:
      return Adam<T, true>(p, g, s0, s1, n, k);
    case UpdateRule::kAdagrad:
      return Adagrad(p, g, s0, n, k);
    case UpdateRule::kAssign:
    case UpdateRule::kAdd:
    case UpdateRule::kFtrl:  // embedding rows only (rows_cpu.cc); CheckRule refused it
      return;
  }
}

}  // namespace

int StateSlots(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kMomentum:
    case UpdateRule::kAdagrad:
      return 1;
    case UpdateRule::kAdam:
    case UpdateRule::kAdamW:
    case UpdateRule::kFtrl:  // z and n
      return 2;
    default:
      return 0;
  }
}

size_t StateElementSize(DType dtype) { return dtype == DType::kF64 ? 8 : 4; }

bool NeedsMaster(DType dtype, UpdateRule rule) {
  return IsOptimizer(rule) && (dtype == DType::kF16 || dtype == DType::kBF16);
}

Status CheckRule(UpdateRule rule, DType dtype) {
  if (rule == UpdateRule::kFtrl) {
    return Status::InvalidArgument("rule ftrl is for embedding tables, not dense tensors");
  }
  if (IsOptimizer(rule) && (dtype == DType::kI32 || dtype == DType::kI64)) {
    return Status::InvalidArgument(std::string("rule ") + UpdateRuleName(rule) +
                                   " needs a floating dtype, not " + DTypeName(dtype));
  }
  return Status::Ok();
}

Status ResetRuleState(UpdateRule rule, const Hyperparams& h, DType dtype, const void* param,
                      size_t n, const RuleState& state) {
  TESSERA_RETURN_IF_ERROR(CheckRule(rule, dtype));
  const int slots = StateSlots(rule);
  if ((slots >= 1 && !state.slot0) || (slots >= 2 && !state.slot1) ||
      (NeedsMaster(dtype, rule) && !state.master)) {
    return Status::Internal(std::string("rule ") + UpdateRuleName(rule) + " on " +
                            DTypeName(dtype) + " has no state buffers to reset");
  }
  const size_t bytes = n * StateElementSize(dtype);
  if (state.slot0) std::memset(state.slot0, 0, bytes);
  if (state.slot1) std::memset(state.slot1, 0, bytes);
  if (rule == UpdateRule::kAdagrad && state.slot0) {
    if (dtype == DType::kF64) {
      std::fill_n(static_cast<double*>(state.slot0), n, static_cast<double>(h.initial_accumulator));
    } else {
      std::fill_n(static_cast<float*>(state.slot0), n, h.initial_accumulator);
    }
  }
  if (state.master) WidenHalves(dtype, static_cast<const uint16_t*>(param), state.master, n);
  return Status::Ok();
}

Status CheckOptimizerStep(UpdateRule rule, DType dtype, const RuleState& state, uint64_t step) {
  TESSERA_RETURN_IF_ERROR(CheckRule(rule, dtype));
  if (!IsOptimizer(rule)) return Status::InvalidArgument("not an optimizer rule");
  if (step == 0) return Status::InvalidArgument("optimizer steps count from 1");
  const int slots = StateSlots(rule);
  if ((slots >= 1 && !state.slot0) || (slots >= 2 && !state.slot1)) {
    return Status::Internal(std::string("rule ") + UpdateRuleName(rule) + " has no state buffers");
  }
  return Status::Ok();
}

Status ApplyOptimizerCpu(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                         const void* grad, size_t n, const RuleState& state, uint64_t step) {
  TESSERA_RETURN_IF_ERROR(CheckOptimizerStep(rule, dtype, state, step));
  switch (dtype) {
    case DType::kF64: {
      auto k = PrepareOptimizer<double>(h, step);
      Step(rule, static_cast<double*>(param), static_cast<const double*>(grad),
           static_cast<double*>(state.slot0), static_cast<double*>(state.slot1), n, k);
      return Status::Ok();
    }
    case DType::kF32: {
      auto k = PrepareOptimizer<float>(h, step);
      Step(rule, static_cast<float*>(param), static_cast<const float*>(grad),
           static_cast<float*>(state.slot0), static_cast<float*>(state.slot1), n, k);
      return Status::Ok();
    }
    case DType::kF16:
    case DType::kBF16: {
      if (!state.master) return Status::Internal("f16/bf16 parameter without its master copy");
      auto k = PrepareOptimizer<float>(h, step);
      auto* p = static_cast<uint16_t*>(param);
      const auto* g = static_cast<const uint16_t*>(grad);
      auto* s0 = static_cast<float*>(state.slot0);
      auto* s1 = static_cast<float*>(state.slot1);
      std::array<float, kHalfBlock> g32;
      for (size_t off = 0; off < n; off += kHalfBlock) {
        const size_t len = std::min(kHalfBlock, n - off);
        WidenHalves(dtype, g + off, g32.data(), len);
        Step(rule, state.master + off, g32.data(), s0 ? s0 + off : nullptr, s1 ? s1 + off : nullptr,
             len, k);
        NarrowToHalves(dtype, state.master + off, p + off, len);
      }
      return Status::Ok();
    }
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return Status::InvalidArgument("unsupported dtype");
}

}  // namespace tessera::kernels
