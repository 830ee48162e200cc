#include "tessera/tensor.h"

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
  }
  return "invalid";
}

bool IsValidUpdateRule(uint8_t raw) { return raw >= 1 && raw <= 2; }

Result<UpdateRule> ParseUpdateRule(std::string_view name) {
  if (name == "assign") return UpdateRule::kAssign;
  if (name == "add") return UpdateRule::kAdd;
  return Status::InvalidArgument("unknown update rule '" + std::string(name) +
                                 "' (expected assign or add)");
}

}  // namespace tessera
