// Update kernels: what a shard does to a parameter with the bytes a worker
// pushed. One interface; the CPU implementation is in cpu/, the CUDA twin
// (later) in cuda/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::kernels {

// dst = rule(dst, src) over n elements of dtype. dst and src do not overlap.
Status ApplyUpdateCpu(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n);

// Half-precision helpers (round to nearest even), shared with tests.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace tessera::kernels
