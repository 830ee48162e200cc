// The update rules applied to embedding rows: one row of `dim` elements at
// a time, each row with its optimizer state beside it and its own step
// count, so that a row updated rarely gets Adam's bias correction for its
// own number of updates. The rules' loops are the dense kernels' (and
// FTRL-Proximal); what is per row is prepared once per table.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "kernels/optimizer_params.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::kernels {

struct RowRule {
  UpdateRule rule = UpdateRule::kSgd;
  DType dtype = DType::kF32;  // the rows' values: f32, f16 or bf16
  Hyperparams hyper;
  FtrlHyperparams ftrl;  // kFtrl
};

class RowUpdater {
 public:
  // An error naming what the rule cannot do (a dtype that is not f32, f16
  // or bf16; a hyper-parameter out of range; FTRL without a learning rate).
  static Result<RowUpdater> Make(const RowRule& rule, uint32_t dim);

  // f32 values of state per row, kept beside the value: the f32 master copy
  // of an f16/bf16 row under an optimizer, then the rule's slots.
  size_t state_floats() const { return state_floats_; }
  const RowRule& rule() const { return rule_; }

  // Sets a new row's state once its value is written: moments 0, the
  // accumulators at their initial value, the master from the value.
  void Reset(const void* value, float* state) const;
  // One update of a row: `grad` is the row's f32 gradient (already summed
  // over the step's workers in sync mode), `step` the row's own count of
  // updates with this one (from 1).
  void Apply(void* value, float* state, const float* grad, uint64_t step) const;

 private:
  RowUpdater(const RowRule& rule, uint32_t dim);
  void ApplyF32(float* p, float* s0, float* s1, const float* g, uint64_t step) const;

  RowRule rule_;
  uint32_t dim_;
  bool master_;
  size_t state_floats_;
  OptimizerParams<float> base_;  // step 1's; Adam's bias corrections per row
  // Adam's bias corrections for a row's first kBiasSteps steps, computed as
  // the dense kernels compute them (OptimizerParams); beyond, per call.
  static constexpr size_t kBiasSteps = 1024;
  std::array<float, kBiasSteps> bc1_{}, bc2_{};
};

}  // namespace tessera::kernels
