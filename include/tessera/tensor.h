// Element types, shapes and update rules of the tensors a shard holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/export.h"
#include "tessera/status.h"

namespace tessera {

// Wire values are stable: they are sent between processes.
enum class DType : uint8_t {
  kF32 = 1,
  kF64 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI32 = 5,
  kI64 = 6,
};

// Size of one element in bytes; 0 for a value that is not a DType.
TESSERA_EXPORT size_t DTypeSize(DType dtype);
// "f32", "f64", "f16", "bf16", "i32", "i64".
TESSERA_EXPORT const char* DTypeName(DType dtype);
TESSERA_EXPORT Result<DType> ParseDType(std::string_view name);
TESSERA_EXPORT bool IsValidDType(uint8_t raw);

// The 2-byte element types, for the typed helpers (PushItem::Of and friends)
// where the compiler has no std::float16_t / std::bfloat16_t: the bits of an
// IEEE 754 half and of a bfloat16, as a trainer's own buffers hold them.
// From float: rounded to nearest even; NaN stays NaN.
struct TESSERA_EXPORT Float16 {
  uint16_t bits = 0;
  static Float16 FromFloat(float value);
  float ToFloat() const;
  bool operator==(const Float16&) const = default;
};
struct TESSERA_EXPORT BFloat16 {
  uint16_t bits = 0;
  static BFloat16 FromFloat(float value);
  float ToFloat() const;
  bool operator==(const BFloat16&) const = default;
};
static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2, "elements are 2 bytes, unpadded");

using Shape = std::vector<int64_t>;

// Number of elements, or an error for a negative dimension or an overflow.
TESSERA_EXPORT Result<uint64_t> NumElements(const Shape& shape);
// "f32[3,4]".
TESSERA_EXPORT std::string DescribeTensor(DType dtype, const Shape& shape);

// What a shard does with the bytes a worker pushes. Wire values are stable.
// The optimizers take the pushed bytes as a gradient and follow PyTorch's
// definitions (torch.optim.SGD, Adam, AdamW, Adagrad).
enum class UpdateRule : uint8_t {
  kAssign = 1,    // tf.Variable.assign: value = pushed
  kAdd = 2,       // tf.Variable.assign_add: value += pushed
  kSgd = 3,       // p -= lr * (g + wd * p)
  kMomentum = 4,  // b = mu * b + (g + wd * p); p -= lr * b   (Nesterov: lr * (g' + mu * b))
  kAdam = 5,      // bias-corrected moments; weight decay added to the gradient
  kAdamW = 6,     // Adam with decoupled weight decay: p *= 1 - lr * wd first
  kAdagrad = 7,   // a += g'^2; p -= lr * g' / (sqrt(a) + eps)
  // FTRL-Proximal, as tf.keras.optimizers.Ftrl (learning_rate_power -0.5),
  // with FtrlHyperparams: the rule of click-through-rate models. Embedding
  // tables only.
  kFtrl = 8,
};

TESSERA_EXPORT const char* UpdateRuleName(UpdateRule rule);
TESSERA_EXPORT Result<UpdateRule> ParseUpdateRule(std::string_view name);
TESSERA_EXPORT bool IsValidUpdateRule(uint8_t raw);
// True for the rules that keep optimizer state and need a floating dtype.
constexpr bool IsOptimizer(UpdateRule rule) {
  return rule != UpdateRule::kAssign && rule != UpdateRule::kAdd;
}

// Hyper-parameters of the optimizer rules (assign and add ignore them).
// Defaults are PyTorch's, except the learning rate.
struct TESSERA_EXPORT Hyperparams {
  float learning_rate = 0.01f;
  float weight_decay = 0.0f;
  float momentum = 0.9f;             // kMomentum
  bool nesterov = false;             // kMomentum
  float beta1 = 0.9f;                // kAdam, kAdamW
  float beta2 = 0.999f;              // kAdam, kAdamW
  float epsilon = 1e-8f;             // kAdam, kAdamW (1e-10 is PyTorch's Adagrad default; set it)
  float initial_accumulator = 0.0f;  // kAdagrad (TensorFlow used 0.1)

  // An error naming the bad field, or OK.
  Status Validate() const;
  bool operator==(const Hyperparams&) const = default;
};

// FTRL-Proximal's own hyper-parameters (its learning rate is
// Hyperparams::learning_rate; weight decay does not apply to it). Defaults
// are tf.keras.optimizers.Ftrl's.
struct TESSERA_EXPORT FtrlHyperparams {
  float l1 = 0.0f;                   // l1_regularization_strength
  float l2 = 0.0f;                   // l2_regularization_strength
  float beta = 0.0f;                 // added to sqrt(n) in the denominator
  float initial_accumulator = 0.1f;  // n's start

  // An error naming the bad field, or OK.
  Status Validate() const;
  bool operator==(const FtrlHyperparams&) const = default;
};

// A rule's hyper-parameters checked for that rule: both structs' Validate,
// and for ftrl a learning rate above 0 and no weight decay (its l2 is what
// regularises).
TESSERA_EXPORT Status ValidateRuleHyperparams(UpdateRule rule, const Hyperparams& hyper,
                                              const FtrlHyperparams& ftrl);

// How pushes from several workers combine (per tensor).
enum class Consistency : uint8_t {
  // Every push applies on arrival (TensorFlow's default).
  kAsync = 1,
  // SyncReplicasOptimizer: a push is tagged with its step; step t applies
  // once replicas_to_aggregate workers pushed for it (summed or averaged);
  // pushes for an already applied step (stale, or backup workers) are
  // dropped and counted.
  kSync = 2,
  // Stale-synchronous: pushes apply on arrival, but a pull may ask that every
  // worker has pushed at least a given number of steps (t - s).
  kBounded = 3,
};

struct TESSERA_EXPORT ConsistencyMode {
  Consistency kind = Consistency::kAsync;
  uint32_t replicas_to_aggregate = 0;  // sync; 0 means total_num_replicas
  uint32_t total_num_replicas = 0;     // sync/bounded; 0 means every worker of the cluster
  bool average = true;                 // sync: average the aggregated gradients (as TF) or sum
  uint32_t staleness = 0;              // bounded: s, for the caller's min_step = t - s

  static ConsistencyMode Async() { return {}; }
  static ConsistencyMode Sync(uint32_t replicas_to_aggregate, uint32_t total_num_replicas,
                              bool average = true) {
    return {Consistency::kSync, replicas_to_aggregate, total_num_replicas, average, 0};
  }
  static ConsistencyMode Bounded(uint32_t staleness, uint32_t total_num_replicas = 0) {
    return {Consistency::kBounded, 0, total_num_replicas, false, staleness};
  }
  Status Validate() const;
  bool operator==(const ConsistencyMode&) const = default;
};

TESSERA_EXPORT const char* ConsistencyName(Consistency kind);

}  // namespace tessera
