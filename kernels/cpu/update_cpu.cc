#include <cmath>
#include <cstring>

#include "kernels/update.h"

namespace tessera::kernels {
namespace {

template <typename T>
void AddLoop(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void AddHalfLoop(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(ToFloat(dst[i]) + ToFloat(src[i]));
}

}  // namespace

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return sign;
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffff) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

Status ApplyUpdateCpu(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n) {
  if (rule == UpdateRule::kAssign) {
    std::memcpy(dst, src, n * DTypeSize(dtype));
    return Status::Ok();
  }
  if (rule != UpdateRule::kAdd) return Status::InvalidArgument("unknown update rule");
  switch (dtype) {
    case DType::kF32:
      AddLoop(static_cast<float*>(dst), static_cast<const float*>(src), n);
      break;
    case DType::kF64:
      AddLoop(static_cast<double*>(dst), static_cast<const double*>(src), n);
      break;
    case DType::kI32: {
      // Wrap-around like TensorFlow's int32 assign_add, without signed-overflow UB.
      AddLoop(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), n);
      break;
    }
    case DType::kI64:
      AddLoop(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), n);
      break;
    case DType::kF16:
      AddHalfLoop<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst),
                                            static_cast<const uint16_t*>(src), n);
      break;
    case DType::kBF16:
      AddHalfLoop<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(dst),
                                                    static_cast<const uint16_t*>(src), n);
      break;
  }
  return Status::Ok();
}

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

size_t AccumulatorElementSize(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 ? 4 : DTypeSize(dtype);
}

void Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first) {
  if (dtype == DType::kF16 || dtype == DType::kBF16) {
    auto* a = static_cast<float*>(acc);
    const auto* g = static_cast<const uint16_t*>(grad);
    auto to_float = dtype == DType::kF16 ? HalfToFloat : BFloat16ToFloat;
    for (size_t i = 0; i < n; ++i) a[i] = (first ? 0.0f : a[i]) + to_float(g[i]);
    return;
  }
  (void)ApplyUpdateCpu(first ? UpdateRule::kAssign : UpdateRule::kAdd, dtype, acc, grad, n);
}

namespace {
template <typename T>
void Scale(T* x, size_t n, T s) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}
}  // namespace

const void* FinishAccumulation(DType dtype, void* acc, size_t n, double scale,
                               std::vector<uint8_t>* out) {
  switch (dtype) {
    case DType::kF64:
      if (scale != 1.0) Scale(static_cast<double*>(acc), n, scale);
      return acc;
    case DType::kF32:
      if (scale != 1.0) Scale(static_cast<float*>(acc), n, static_cast<float>(scale));
      return acc;
    case DType::kF16:
    case DType::kBF16: {
      auto* a = static_cast<float*>(acc);
      out->resize(n * 2);
      auto* o = reinterpret_cast<uint16_t*>(out->data());
      auto from_float = dtype == DType::kF16 ? FloatToHalf : FloatToBFloat16;
      for (size_t i = 0; i < n; ++i) o[i] = from_float(a[i] * static_cast<float>(scale));
      return out->data();
    }
    case DType::kI32:
    case DType::kI64:
      return acc;  // integers are summed, never averaged (the decoder refuses it)
  }
  return acc;
}

}  // namespace tessera::kernels
