#include "embed/row_initializer.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "core/bytes.h"
#include "core/dtype.h"
#include "core/row_placement.h"

namespace tessera::embed {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// A uniform double in (0, 1] from 53 bits of a counter's hash.
double Unit(uint64_t counter) {
  return static_cast<double>((MixBits(counter) >> 11) + 1) * 0x1.0p-53;
}

}  // namespace

Result<RowInitializer> RowInitializer::Make(const Initializer& init, DType dtype, uint32_t dim,
                                            std::string_view table) {
  const std::string who = "embedding table '" + std::string(table) + "'";
  if (init.needs_shape()) {
    return Status::InvalidArgument(who +
                                   ": Glorot initializers need a fixed shape, and a table's "
                                   "rows are unbounded: use uniform or normal");
  }
  TESSERA_RETURN_IF_ERROR(init.Validate().WithContext(who));
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return Status::InvalidArgument(who + ": rows are f32, f16 or bf16, not " + DTypeName(dtype));
  }
  const auto* name = reinterpret_cast<const uint8_t*>(table.data());
  const uint64_t seed = MixBits(init.seed ^ Fnv1a64({name, table.size()}));
  return RowInitializer(init, dtype, dim, seed);
}

double RowInitializer::Draw(uint64_t row_key, uint32_t element) const {
  using Kind = Initializer::Kind;
  const uint64_t counter = row_key + (uint64_t{element} + 1) * kGolden;
  switch (init_.kind) {
    case Kind::kConstant:
      return init_.value;
    case Kind::kUniform:
      return init_.low + (init_.high - init_.low) * (Unit(counter) - 0x1.0p-53);
    case Kind::kNormal:
    case Kind::kTruncatedNormal:
      // Box-Muller from two counters of this element; a truncated draw
      // beyond two standard deviations is drawn again from the next pair.
      for (uint64_t attempt = 0;; ++attempt) {
        const uint64_t c = MixBits(counter ^ (attempt * 0xd1b54a32d192ed03ULL));
        const double z = std::sqrt(-2.0 * std::log(Unit(c))) *
                         std::cos(2.0 * std::numbers::pi * Unit(c + kGolden));
        if (init_.kind == Kind::kNormal || std::fabs(z) <= 2.0) {
          return init_.mean + init_.stddev * z;
        }
      }
    default:
      return 0.0;
  }
}

void RowInitializer::Fill(int64_t id, void* value) const {
  const uint64_t row_key = MixBits(seed_ ^ MixBits(static_cast<uint64_t>(id)));
  const size_t esize = DTypeSize(dtype_);
  if (init_.kind == Initializer::Kind::kZeros) {
    std::memset(value, 0, dim_ * esize);  // +0.0 in every dtype
    return;
  }
  auto* out = static_cast<uint8_t*>(value);
  for (uint32_t j = 0; j < dim_; ++j) StoreAs(dtype_, Draw(row_key, j), out + j * esize);
}

}  // namespace tessera::embed
