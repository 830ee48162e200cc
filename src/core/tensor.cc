#include "tessera/tensor.h"
#include "tessera/client.h"

#include "core/dtype.h"

#include <cmath>
#include <limits>

namespace tessera {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF64:
    case DType::kI64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "invalid";
}

bool IsValidDType(uint8_t raw) { return raw >= 1 && raw <= 6; }

Result<DType> ParseDType(std::string_view name) {
  for (uint8_t raw = 1; raw <= 6; ++raw) {
    auto dtype = static_cast<DType>(raw);
    if (name == DTypeName(dtype)) return dtype;
  }
  return Status::InvalidArgument("unknown dtype '" + std::string(name) +
                                 "' (expected f32, f64, f16, bf16, i32 or i64)");
}

Result<uint64_t> NumElements(const Shape& shape) {
  uint64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return Status::InvalidArgument("negative dimension " + std::to_string(dim));
    if (dim != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return Status::InvalidArgument("shape has more elements than fit in 64 bits");
    }
    n *= static_cast<uint64_t>(dim);
  }
  return n;
}

std::string DescribeTensor(DType dtype, const Shape& shape) {
  std::string out = DTypeName(dtype);
  out += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(shape[i]);
  }
  out += ']';
  return out;
}

const char* UpdateRuleName(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kAssign:
      return "assign";
    case UpdateRule::kAdd:
      return "add";
    case UpdateRule::kSgd:
      return "sgd";
    case UpdateRule::kMomentum:
      return "momentum";
    case UpdateRule::kAdam:
      return "adam";
    case UpdateRule::kAdamW:
      return "adamw";
    case UpdateRule::kAdagrad:
      return "adagrad";
    case UpdateRule::kFtrl:
      return "ftrl";
  }
  return "invalid";
}

bool IsValidUpdateRule(uint8_t raw) { return raw >= 1 && raw <= 8; }

Result<UpdateRule> ParseUpdateRule(std::string_view name) {
  for (uint8_t raw = 1; raw <= 8; ++raw) {
    auto rule = static_cast<UpdateRule>(raw);
    if (name == UpdateRuleName(rule)) return rule;
  }
  return Status::InvalidArgument(
      "unknown update rule '" + std::string(name) +
      "' (expected assign, add, sgd, momentum, adam, adamw, adagrad or ftrl)");
}

Status Hyperparams::Validate() const {
  auto bad = [](const char* field, float value, const char* want) {
    return Status::InvalidArgument(std::string("hyper-parameter ") + field + " = " +
                                   std::to_string(value) + " (must be " + want + ")");
  };
  if (!(learning_rate >= 0.0f) || std::isinf(learning_rate))
    return bad("learning_rate", learning_rate, "finite and >= 0");
  if (!(weight_decay >= 0.0f) || std::isinf(weight_decay))
    return bad("weight_decay", weight_decay, "finite and >= 0");
  if (!(momentum >= 0.0f && momentum < 1.0f)) return bad("momentum", momentum, "in [0, 1)");
  if (!(beta1 >= 0.0f && beta1 < 1.0f)) return bad("beta1", beta1, "in [0, 1)");
  if (!(beta2 >= 0.0f && beta2 < 1.0f)) return bad("beta2", beta2, "in [0, 1)");
  if (!(epsilon > 0.0f) || std::isinf(epsilon)) return bad("epsilon", epsilon, "finite and > 0");
  if (!(initial_accumulator >= 0.0f) || std::isinf(initial_accumulator)) {
    return bad("initial_accumulator", initial_accumulator, "finite and >= 0");
  }
  return Status::Ok();
}

Status FtrlHyperparams::Validate() const {
  auto bad = [](const char* field, float value, const char* want) {
    return Status::InvalidArgument(std::string("ftrl hyper-parameter ") + field + " = " +
                                   std::to_string(value) + " (must be " + want + ")");
  };
  if (!(l1 >= 0.0f) || std::isinf(l1)) return bad("l1", l1, "finite and >= 0");
  if (!(l2 >= 0.0f) || std::isinf(l2)) return bad("l2", l2, "finite and >= 0");
  if (!(beta >= 0.0f) || std::isinf(beta)) return bad("beta", beta, "finite and >= 0");
  if (!(initial_accumulator >= 0.0f) || std::isinf(initial_accumulator)) {
    return bad("initial_accumulator", initial_accumulator, "finite and >= 0");
  }
  return Status::Ok();
}

Status ValidateRuleHyperparams(UpdateRule rule, const Hyperparams& hyper,
                               const FtrlHyperparams& ftrl) {
  TESSERA_RETURN_IF_ERROR(hyper.Validate());
  if (rule != UpdateRule::kFtrl) return Status::Ok();
  TESSERA_RETURN_IF_ERROR(ftrl.Validate());
  if (!(hyper.learning_rate > 0.0f)) {
    return Status::InvalidArgument("rule ftrl needs learning_rate > 0");
  }
  if (hyper.weight_decay != 0.0f) {
    return Status::InvalidArgument("weight_decay does not apply to rule ftrl (its l2 regularises)");
  }
  return Status::Ok();
}

Status Initializer::Validate() const {
  if (kind > Kind::kGlorotNormal) {
    // Reachable from the C API and bindings, where the kind is a plain integer.
    return Status::InvalidArgument("unknown initializer kind " +
                                   std::to_string(static_cast<int>(kind)));
  }
  for (double v : {value, low, high, mean, stddev}) {
    if (!std::isfinite(v)) return Status::InvalidArgument("an initializer's values must be finite");
  }
  if (kind == Kind::kUniform && !(low < high)) {
    return Status::InvalidArgument("uniform initializer needs low < high");
  }
  if ((kind == Kind::kNormal || kind == Kind::kTruncatedNormal) && !(stddev > 0)) {
    return Status::InvalidArgument("normal initializer needs stddev > 0");
  }
  return Status::Ok();
}

const char* ConsistencyName(Consistency kind) {
  switch (kind) {
    case Consistency::kAsync:
      return "async";
    case Consistency::kSync:
      return "sync";
    case Consistency::kBounded:
      return "bounded";
  }
  return "invalid";
}

Status ConsistencyMode::Validate() const {
  if (kind != Consistency::kAsync && kind != Consistency::kSync && kind != Consistency::kBounded) {
    return Status::InvalidArgument("invalid consistency mode " +
                                   std::to_string(static_cast<int>(kind)));
  }
  if (kind == Consistency::kSync) {
    if (total_num_replicas == 0 || replicas_to_aggregate == 0) {
      return Status::InvalidArgument(
          "sync mode needs replicas_to_aggregate and total_num_replicas");
    }
    if (replicas_to_aggregate > total_num_replicas) {
      return Status::InvalidArgument(
          "sync mode: replicas_to_aggregate (" + std::to_string(replicas_to_aggregate) +
          ") exceeds total_num_replicas (" + std::to_string(total_num_replicas) + ")");
    }
  }
  if (kind == Consistency::kBounded && total_num_replicas == 0) {
    return Status::InvalidArgument("bounded mode needs total_num_replicas");
  }
  return Status::Ok();
}

Float16 Float16::FromFloat(float value) { return {FloatToHalf(value)}; }
float Float16::ToFloat() const { return HalfToFloat(bits); }
BFloat16 BFloat16::FromFloat(float value) { return {FloatToBFloat16(value)}; }
float BFloat16::ToFloat() const { return BFloat16ToFloat(bits); }

}  // namespace tessera
