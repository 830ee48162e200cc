// Update kernels: what a shard does to a parameter with the bytes a worker
// pushed. One interface; the CPU implementation is in cpu/, the CUDA twin
// in cuda/ (kernels_cuda.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::kernels {

// dst = rule(dst, src) over n elements of dtype, for assign and add. dst and
// src do not overlap.
Status ApplyUpdateCpu(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n);
// The same for a rule already known to be assign or add (the declaration
// checked it): no Status, for a shard's batch of small host chunks, where
// building and passing one back per chunk cost as much as the update.
void ApplyPlainRuleCpu(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n);

// Sync-step aggregation. The running sum is kept in f32 for f16/bf16
// gradients (so that adding many replicas does not round each time), else in
// the gradient's own dtype.
size_t AccumulatorElementSize(DType dtype);
// acc (+)= grad; `first` overwrites instead of adding.
[[nodiscard]] Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first);
// Scales the sum (averaging) and returns it as a gradient of `dtype`: acc
// itself, or for f16/bf16 `out` (resized) holding the rounded values.
const void* FinishAccumulation(DType dtype, void* acc, size_t n, double scale,
                               std::vector<uint8_t>* out);

// Optimizer state of one chunk, beside its parameter on the shard. Moments
// are kept in the compute type: f64 for f64 parameters, f32 otherwise.
struct RuleState {
  void* slot0 = nullptr;    // momentum buffer, Adam's first moment, Adagrad's sum
  void* slot1 = nullptr;    // Adam's second moment
  float* master = nullptr;  // the f32 master copy of an f16/bf16 parameter
};

// How many moment slots a rule keeps (0, 1 or 2).
int StateSlots(UpdateRule rule);
// Bytes of one element of state for a parameter of this dtype.
size_t StateElementSize(DType dtype);
// f16/bf16 parameters under an optimizer keep an f32 master copy.
bool NeedsMaster(DType dtype, UpdateRule rule);
// Checks that the rule can apply to the dtype (optimizers need floats).
Status CheckRule(UpdateRule rule, DType dtype);
// What every optimizer step checks first, on the CPU and on a GPU: the rule
// is an optimizer that suits the dtype, steps count from 1, and the rule's
// state buffers are there.
Status CheckOptimizerStep(UpdateRule rule, DType dtype, const RuleState& state, uint64_t step);

// Sets state for a freshly assigned parameter: zero moments, Adagrad's sum at
// initial_accumulator, the master copy from the parameter's value. An error
// when the rule cannot apply to the dtype or a state buffer it needs is missing.
[[nodiscard]] Status ResetRuleState(UpdateRule rule, const Hyperparams& h, DType dtype,
                                    const void* param, size_t n, const RuleState& state);

// One optimizer step: param and state updated in place from the gradient
// (same dtype as the parameter). `step` counts this chunk's updates from 1
// (Adam's bias correction).
Status ApplyOptimizerCpu(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                         const void* grad, size_t n, const RuleState& state, uint64_t step);

}  // namespace tessera::kernels
