// bf16 converts with integer arithmetic that every vector unit has: plain
// loops over core/dtype.h's branch-free functions, which GCC vectorises,
// built for AVX-512, AVX2 and baseline x86-64 (target_clones, as the
// optimizers); the fused add, which GCC vectorised poorly, is written out
// for AVX-512 and AVX2. f16 needs the hardware's conversion instructions (F16C). Both
// are chosen at run time; a CPU without them takes the scalar functions.
#include "kernels/cpu/halves_cpu.h"

#include <array>

#include "core/dtype.h"

// ThreadSanitizer cannot run an IFUNC resolver (target_clones' dispatch):
// the loader calls it before TSan's runtime is up, and it crashes. A TSan
// build takes the baseline copy.
#if defined(__SANITIZE_THREAD__)
#define TESSERA_NO_IFUNC 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TESSERA_NO_IFUNC 1
#endif
#endif

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__x86_64__) && !defined(TESSERA_NO_IFUNC)
#define TESSERA_HALF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TESSERA_HALF_CLONES
#endif

namespace tessera::kernels {
namespace {

TESSERA_HALF_CLONES
void WidenBFloat16(const uint16_t* __restrict in, float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
}

TESSERA_HALF_CLONES
void NarrowToBFloat16(const float* __restrict in, uint16_t* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
}

TESSERA_HALF_CLONES
void AddBFloat16(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = FloatToBFloat16(BFloat16ToFloat(dst[i]) + BFloat16ToFloat(src[i]));
}

void AddHalfScalar(uint16_t* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(HalfToFloat(dst[i]) + HalfToFloat(src[i]));
}

void WidenHalfScalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void NarrowToHalfScalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void WidenHalfF16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    __m256 f = _mm256_cvtph_ps(h);
    // A signalling NaN is widened quiet by the hardware; HalfToFloat keeps
    // its bits. Keep them too: the widened value must be the same.
    const __m128i magnitude = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    const __m128i is_nan = _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7c00));
    if (!_mm_testz_si128(is_nan, is_nan)) {
      const __m256i widened_bits = _mm256_or_si256(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_and_si128(h, _mm_set1_epi16(-32768))), 16),
          _mm256_or_si256(_mm256_set1_epi32(0x7f800000),
                          _mm256_slli_epi32(
                              _mm256_cvtepu16_epi32(_mm_and_si128(h, _mm_set1_epi16(0x3ff))), 13)));
      const __m256i mask = _mm256_cvtepi16_epi32(is_nan);
      f = _mm256_blendv_ps(f, _mm256_castsi256_ps(widened_bits), _mm256_castsi256_ps(mask));
    }
    _mm256_storeu_ps(out + i, f);
  }
  WidenHalfScalar(in + i, out + i, n - i);
}

// Eight floats to halves, rounded to nearest even. The hardware keeps a
// NaN's payload; FloatToHalf gives the quiet NaN of its sign, and so does this.
__attribute__((target("avx2,f16c"))) inline __m128i RoundToHalves(__m256 f) {
  const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
  const __m128i magnitude = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  const __m128i is_nan = _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7c00));
  const __m128i canonical =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(-32768)), _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, canonical, is_nan);
}

__attribute__((target("avx2,f16c"))) void NarrowToHalfF16c(const float* in, uint16_t* out,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), RoundToHalves(_mm256_loadu_ps(in + i)));
  }
  NarrowToHalfScalar(in + i, out + i, n - i);
}

// A NaN operand's payload does not matter here: the sum is NaN, and is
// rounded to the canonical NaN whatever its bits.
__attribute__((target("avx2,f16c"))) void AddHalfF16c(uint16_t* dst, const uint16_t* src,
                                                      size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dst + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), RoundToHalves(_mm256_add_ps(a, b)));
  }
  AddHalfScalar(dst + i, src + i, n - i);
}

// GCC 12's plain AVX-512 intrinsics (shifts, conversions) start from an
// `_mm512_undefined_*` value that -Wmaybe-uninitialized rejects; their
// zero-masked forms with every lane selected are the same instruction.
constexpr __mmask16 kAllLanes = 0xffff;
// vfpclassps' classes that make a NaN: quiet (0x01) or signalling (0x80).
constexpr int kQuietOrSignalingNan = 0x81;

__attribute__((target("avx512f"))) inline __m512i TopHalves(__m512i x) {
  return _mm512_maskz_srli_epi32(kAllLanes, x, 16);
}

// Sixteen f16 sums at a time with AVX-512F's conversions; the rounding and
// NaN rule as RoundToHalves (a NaN's payload does not matter here either).
// The conversions are the masked forms with every lane selected, for the
// reason kAllLanes gives. A NaN sum is found by its class (AVX-512DQ) and
// made canonical by one masked blend (AVX-512BW/VL): three instructions
// where a compare on the narrowed halves took five.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c"))) void AddHalfAvx512(
    uint16_t* dst, const uint16_t* src, size_t n) {
  constexpr int kSignOrQuietNan = 0xea;  // ternary logic: a & b | c
  const __m256i sign = _mm256_set1_epi16(-32768);
  const __m256i quiet_nan = _mm256_set1_epi16(0x7e00);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_maskz_cvtph_ps(
        kAllLanes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + i)));
    const __m512 b = _mm512_maskz_cvtph_ps(
        kAllLanes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m512 sum = _mm512_add_ps(a, b);
    const __m256i h = _mm512_maskz_cvtps_ph(kAllLanes, sum, _MM_FROUND_TO_NEAREST_INT);
    const __m256i canonical = _mm256_ternarylogic_epi32(h, sign, quiet_nan, kSignOrQuietNan);
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst + i),
        _mm256_mask_blend_epi16(_mm512_fpclass_ps_mask(sum, kQuietOrSignalingNan), h, canonical));
  }
  AddHalfF16c(dst + i, src + i, n - i);
}

// Sixteen bf16 sums at a time. Widening is a shift into the top half of
// each 32-bit lane (unpack with zeros), narrowing FloatToBFloat16's
// arithmetic on whole vectors; unpack and pack both work within 128-bit
// lanes, so the elements come back in their order.
__attribute__((target("avx2"))) inline __m256i RoundToBFloat16x8(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

__attribute__((target("avx2"))) void AddBFloat16Avx2(uint16_t* dst, const uint16_t* src, size_t n) {
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256 lo = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, a)),
                                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, b)));
    const __m256 hi = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, a)),
                                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, b)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_packus_epi32(RoundToBFloat16x8(lo), RoundToBFloat16x8(hi)));
  }
  AddBFloat16(dst + i, src + i, n - i);
}

// The same with AVX-512BW: thirty-two at a time. At 1 MiB the AVX2 loop
// is bound by its instruction count, not by memory (0.57x memcpy's traffic
// against f32 add's 1.48x), so each sum's rounding is left in the top half
// of its lane and one two-source word permute picks the 32 top halves in
// order, where shifting each down and packing took three instructions; a
// NaN is found by its class (AVX-512DQ), not by a mask and a compare.
__attribute__((target("avx512f,avx512bw,avx512dq"))) inline __m512i RoundToBFloat16Top(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i odd = _mm512_and_si512(TopHalves(x), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  const __m512i quiet_nan = _mm512_or_si512(x, _mm512_set1_epi32(0x400000));
  return _mm512_mask_blend_epi32(_mm512_fpclass_ps_mask(f, kQuietOrSignalingNan), rounded,
                                 quiet_nan);
}

// Word j of the result is element j: in 128-bit lane L = j / 8, the
// unpacked low vector holds elements 8L..8L+3 and the high one 8L+4..8L+7,
// each sum's bf16 in the top (odd) word of its 32-bit lane. (A table built
// at compile time: a small tensor's add pays nothing for it.)
constexpr std::array<uint16_t, 32> kTopHalvesInOrder = [] {
  std::array<uint16_t, 32> index{};
  for (int j = 0; j < 32; ++j) {
    const int lane = j / 8, k = j % 8;
    index[j] =
        static_cast<uint16_t>(k < 4 ? 2 * (4 * lane + k) + 1 : 32 + 2 * (4 * lane + k - 4) + 1);
  }
  return index;
}();

__attribute__((target("avx512f,avx512bw,avx512dq"))) void AddBFloat16Avx512(uint16_t* dst,
                                                                            const uint16_t* src,
                                                                            size_t n) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i in_order = _mm512_loadu_si512(kTopHalvesInOrder.data());
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i a = _mm512_loadu_si512(dst + i);
    const __m512i b = _mm512_loadu_si512(src + i);
    const __m512 lo = _mm512_add_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, a)),
                                    _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, b)));
    const __m512 hi = _mm512_add_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, a)),
                                    _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, b)));
    _mm512_storeu_si512(dst + i, _mm512_permutex2var_epi16(RoundToBFloat16Top(lo), in_order,
                                                           RoundToBFloat16Top(hi)));
  }
  AddBFloat16Avx2(dst + i, src + i, n - i);
}

bool HasF16c() {
  // F16C from CPUID itself: clang's __builtin_cpu_supports does not know it.
  // AVX2 through the builtin, which also checks the OS saves AVX state.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
// The AVX-512 paths use F, BW, DQ and VL, which every AVX-512 server CPU
// since Skylake-SP has.
bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return has;
}
#else
bool HasF16c() { return false; }
#endif

}  // namespace

void WidenHalves(DType dtype, const uint16_t* in, float* out, size_t n) {
  if (dtype == DType::kBF16) return WidenBFloat16(in, out, n);
#if defined(__x86_64__)
  if (HasF16c()) return WidenHalfF16c(in, out, n);
#endif
  WidenHalfScalar(in, out, n);
}

void NarrowToHalves(DType dtype, const float* in, uint16_t* out, size_t n) {
  if (dtype == DType::kBF16) return NarrowToBFloat16(in, out, n);
#if defined(__x86_64__)
  if (HasF16c()) return NarrowToHalfF16c(in, out, n);
#endif
  NarrowToHalfScalar(in, out, n);
}

bool CanRun(HalfAddPath path, DType dtype) {
  switch (path) {
    case HalfAddPath::kScalar:
      return true;
#if defined(__x86_64__)
    case HalfAddPath::kAvx2:
      return dtype == DType::kBF16 ? HasAvx2() : HasF16c();
    case HalfAddPath::kAvx512:
      return HasAvx512() && (dtype == DType::kBF16 || HasF16c());
#else
    default:
      return false;
#endif
  }
  return false;
}

void AddHalvesUsing(HalfAddPath path, DType dtype, uint16_t* dst, const uint16_t* src, size_t n) {
#if defined(__x86_64__)
  if (CanRun(path, dtype)) {
    const bool bf16 = dtype == DType::kBF16;
    if (path == HalfAddPath::kAvx512)
      return bf16 ? AddBFloat16Avx512(dst, src, n) : AddHalfAvx512(dst, src, n);
    if (path == HalfAddPath::kAvx2)
      return bf16 ? AddBFloat16Avx2(dst, src, n) : AddHalfF16c(dst, src, n);
  }
#endif
  if (dtype == DType::kBF16) return AddBFloat16(dst, src, n);
  AddHalfScalar(dst, src, n);
}

void AddHalves(DType dtype, uint16_t* dst, const uint16_t* src, size_t n) {
  for (auto path : {HalfAddPath::kAvx512, HalfAddPath::kAvx2}) {
    if (CanRun(path, dtype)) return AddHalvesUsing(path, dtype, dst, src, n);
  }
  AddHalvesUsing(HalfAddPath::kScalar, dtype, dst, src, n);
}

const char* HalfConversionPath() { return HasF16c() ? "f16c" : "scalar"; }

}  // namespace tessera::kernels
