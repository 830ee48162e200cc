// Element types, shapes and update rules of the tensors a shard holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
size_t DTypeSize(DType dtype);
// "f32", "f64", "f16", "bf16", "i32", "i64".
const char* DTypeName(DType dtype);
Result<DType> ParseDType(std::string_view name);
bool IsValidDType(uint8_t raw);

using Shape = std::vector<int64_t>;

// Number of elements, or an error for a negative dimension or an overflow.
Result<uint64_t> NumElements(const Shape& shape);
// "f32[3,4]".
std::string DescribeTensor(DType dtype, const Shape& shape);

// What a shard does with the bytes a worker pushes. Wire values are stable.
enum class UpdateRule : uint8_t {
  kAssign = 1,  // tf.Variable.assign: value = pushed
  kAdd = 2,     // tf.Variable.assign_add: value += pushed
};

const char* UpdateRuleName(UpdateRule rule);
Result<UpdateRule> ParseUpdateRule(std::string_view name);
bool IsValidUpdateRule(uint8_t raw);

}  // namespace tessera
