// f16 and bf16 to and from f32, a block at a time: the one place where the
// CPU kernels convert halves. The f16/bf16 kernels widen their operands into
// f32 blocks, run the f32 kernel, and narrow the result, so that they run at
// the f32 kernel's speed instead of one scalar conversion per element; `add`,
// all conversion, is one fused pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/tensor.h"

namespace tessera::kernels {

// Elements per block: two f32 blocks of operands fit in L1 beside the
// halves they come from.
inline constexpr size_t kHalfBlock = 1024;

// out[i] = the f32 value of in[i] (f16 or bf16). Exact: every half is an f32.
void WidenHalves(DType dtype, const uint16_t* in, float* out, size_t n);

// out[i] = in[i] rounded to nearest even, as FloatToHalf and FloatToBFloat16
// (core/dtype.h) round it, bit for bit: overflow to infinity, subnormals,
// and a NaN as the quiet NaN of its sign (f16: sign | 0x7e00; bf16: its top
// bits with the quiet bit set).
void NarrowToHalves(DType dtype, const float* in, uint16_t* out, size_t n);

// dst[i] = dst[i] + src[i] for f16/bf16 in one pass: both widened to f32,
// added, rounded once, as NarrowToHalves rounds.
void AddHalves(DType dtype, uint16_t* dst, const uint16_t* src, size_t n);

// The fused add's code paths (AddHalves takes the widest this CPU has), for
// tests that must check each one, and benches that compare them. kAvx2 is
// AVX2 for bf16, AVX2 with F16C for f16.
enum class HalfAddPath { kScalar, kAvx2, kAvx512 };
bool CanRun(HalfAddPath path, DType dtype);
void AddHalvesUsing(HalfAddPath path, DType dtype, uint16_t* dst, const uint16_t* src, size_t n);

// Which f16 conversion this CPU runs: "f16c" or "scalar".
const char* HalfConversionPath();

}  // namespace tessera::kernels
