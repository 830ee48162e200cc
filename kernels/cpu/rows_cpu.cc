// Embedding rows' updates on the CPU: the dense rules' loops (one row of
// `dim` elements per call), the rule's parameters prepared once per table.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "kernels/cpu/halves_cpu.h"
#include "kernels/cpu/optimizer_loops.h"
#include "kernels/rows.h"
#include "kernels/update.h"

namespace tessera::kernels {
namespace {

bool IsHalf(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

// dst = src (assign) or dst += src (add) for a row of halves, through f32
// blocks: rows without an optimizer keep no master copy.
void PlainRuleOnHalves(UpdateRule rule, DType dtype, uint16_t* value, const float* grad,
                       uint32_t dim) {
  std::array<float, kHalfBlock> block;
  for (uint32_t off = 0; off < dim; off += kHalfBlock) {
    const size_t len = std::min<size_t>(kHalfBlock, dim - off);
    if (rule == UpdateRule::kAdd) {
      WidenHalves(dtype, value + off, block.data(), len);
      for (size_t i = 0; i < len; ++i) block[i] += grad[off + i];
      NarrowToHalves(dtype, block.data(), value + off, len);
    } else {
      NarrowToHalves(dtype, grad + off, value + off, len);
    }
  }
}

}  // namespace

Result<RowUpdater> RowUpdater::Make(const RowRule& rule, uint32_t dim) {
  if (dim == 0) return Status::InvalidArgument("an embedding row needs dim >= 1");
  if (rule.dtype != DType::kF32 && !IsHalf(rule.dtype)) {
    return Status::InvalidArgument(std::string("embedding rows are f32, f16 or bf16, not ") +
                                   DTypeName(rule.dtype));
  }
  if (!IsValidUpdateRule(static_cast<uint8_t>(rule.rule))) {
    return Status::InvalidArgument("unknown update rule " +
                                   std::to_string(static_cast<int>(rule.rule)));
  }
  TESSERA_RETURN_IF_ERROR(ValidateRuleHyperparams(rule.rule, rule.hyper, rule.ftrl));
  return RowUpdater(rule, dim);
}

RowUpdater::RowUpdater(const RowRule& rule, uint32_t dim)
    : rule_(rule),
      dim_(dim),
      master_(IsOptimizer(rule.rule) && IsHalf(rule.dtype)),
      state_floats_((master_ ? dim : 0) + static_cast<size_t>(StateSlots(rule.rule)) * dim),
      base_(PrepareOptimizer<float>(rule.hyper, 1)) {
  if (rule.rule == UpdateRule::kAdam || rule.rule == UpdateRule::kAdamW) {
    for (size_t t = 1; t <= kBiasSteps; ++t) {
      const auto k = PrepareOptimizer<float>(rule.hyper, t);
      bc1_[t - 1] = k.bc1;
      bc2_[t - 1] = k.bc2;
    }
  }
}

void RowUpdater::Reset(const void* value, float* state) const {
  if (state_floats_ == 0) return;
  float* slots = state + (master_ ? dim_ : 0);
  const size_t slot_floats = state_floats_ - (master_ ? dim_ : 0);
  std::fill_n(slots, slot_floats, 0.0f);
  if (rule_.rule == UpdateRule::kAdagrad) {
    std::fill_n(slots, dim_, rule_.hyper.initial_accumulator);
  } else if (rule_.rule == UpdateRule::kFtrl) {
    std::fill_n(slots + dim_, dim_, rule_.ftrl.initial_accumulator);  // n; z stays 0
  }
  if (master_) WidenHalves(rule_.dtype, static_cast<const uint16_t*>(value), state, dim_);
}

void RowUpdater::Apply(void* value, float* state, const float* grad, uint64_t step) const {
  if (!IsOptimizer(rule_.rule)) {
    if (IsHalf(rule_.dtype)) {
      return PlainRuleOnHalves(rule_.rule, rule_.dtype, static_cast<uint16_t*>(value), grad, dim_);
    }
    auto* p = static_cast<float*>(value);
    if (rule_.rule == UpdateRule::kAdd) {
      for (uint32_t i = 0; i < dim_; ++i) p[i] += grad[i];
    } else {
      std::memcpy(p, grad, dim_ * sizeof(float));
    }
    return;
  }
  float* p = master_ ? state : static_cast<float*>(value);
  float* s0 = state + (master_ ? dim_ : 0);
  ApplyF32(p, s0, s0 + dim_, grad, step);
  if (master_) NarrowToHalves(rule_.dtype, state, static_cast<uint16_t*>(value), dim_);
}

void RowUpdater::ApplyF32(float* p, float* s0, float* s1, const float* g, uint64_t step) const {
  auto k = base_;
  switch (rule_.rule) {
    case UpdateRule::kSgd:
      return Sgd(p, g, dim_, k);
    case UpdateRule::kMomentum:
      return Momentum(p, g, s0, dim_, k);
    case UpdateRule::kAdam:
    case UpdateRule::kAdamW:
      if (step >= 1 && step <= kBiasSteps) {
        k.bc1 = bc1_[step - 1];
        k.bc2 = bc2_[step - 1];
      } else {
        k = PrepareOptimizer<float>(rule_.hyper, step);
      }
      if (rule_.rule == UpdateRule::kAdamW) return Adam<float, true>(p, g, s0, s1, dim_, k);
      return Adam<float, false>(p, g, s0, s1, dim_, k);
    case UpdateRule::kAdagrad:
      return Adagrad(p, g, s0, dim_, k);
    case UpdateRule::kFtrl: {
      const FtrlLoopParams<float> f{rule_.hyper.learning_rate, rule_.ftrl.l1, rule_.ftrl.l2,
                                    rule_.ftrl.beta};
      return Ftrl(p, g, s0, s1, dim_, f);
    }
    case UpdateRule::kAssign:
    case UpdateRule::kAdd:
      return;
  }
}

}  // namespace tessera::kernels
