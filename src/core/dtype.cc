#include "core/dtype.h"

#include <cmath>

namespace tessera {

void StoreAs(DType dtype, double value, void* out) {
  switch (dtype) {
    case DType::kF32: {
      float f = static_cast<float>(value);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::kF64:
      std::memcpy(out, &value, 8);
      return;
    case DType::kF16:
    case DType::kBF16: {
      uint16_t h = dtype == DType::kF16 ? FloatToHalf(static_cast<float>(value))
                                        : FloatToBFloat16(static_cast<float>(value));
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kI32: {
      auto i = static_cast<int32_t>(std::llround(value));
      std::memcpy(out, &i, 4);
      return;
    }
    case DType::kI64: {
      auto i = static_cast<int64_t>(std::llround(value));
      std::memcpy(out, &i, 8);
      return;
    }
  }
}

}  // namespace tessera
