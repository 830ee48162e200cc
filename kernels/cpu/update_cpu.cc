#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/halves_cpu.h"
#include "kernels/update.h"

namespace tessera::kernels {
namespace {

template <typename T>
void AddLoop(T* __restrict dst, const T* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

Status ApplyUpdateCpu(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n) {
  if (rule != UpdateRule::kAssign && rule != UpdateRule::kAdd) {
    return Status::InvalidArgument("unknown update rule");
  }
  ApplyPlainRuleCpu(rule, dtype, dst, src, n);
  return Status::Ok();
}

void ApplyPlainRuleCpu(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n) {
  if (rule == UpdateRule::kAssign) {
    std::memcpy(dst, src, n * DTypeSize(dtype));
    return;
  }
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
    case DType::kBF16:
      AddHalves(dtype, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
      break;
  }
}

size_t AccumulatorElementSize(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 ? 4 : DTypeSize(dtype);
}

Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first) {
  if (dtype == DType::kF16 || dtype == DType::kBF16) {
    auto* a = static_cast<float*>(acc);
    const auto* g = static_cast<const uint16_t*>(grad);
    std::array<float, kHalfBlock> g32;
    for (size_t off = 0; off < n; off += kHalfBlock) {
      const size_t len = std::min(kHalfBlock, n - off);
      WidenHalves(dtype, g + off, g32.data(), len);
      // The first gradient is added to +0 (a -0 gradient sums to +0), as the
      // CUDA twin does.
      if (first) std::fill_n(a + off, len, 0.0f);
      AddLoop(a + off, g32.data(), len);
    }
    return Status::Ok();
  }
  return ApplyUpdateCpu(first ? UpdateRule::kAssign : UpdateRule::kAdd, dtype, acc, grad, n);
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
      if (scale != 1.0) Scale(a, n, static_cast<float>(scale));
      NarrowToHalves(dtype, a, reinterpret_cast<uint16_t*>(out->data()), n);
      return out->data();
    }
    case DType::kI32:
    case DType::kI64:
      return acc;  // integers are summed, never averaged (the decoder refuses it)
  }
  return acc;
}

}  // namespace tessera::kernels
