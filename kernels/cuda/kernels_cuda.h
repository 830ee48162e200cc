// The update kernels on an NVIDIA GPU: the same contract as kernels/update.h's
// CPU functions, on device pointers, enqueued on a CUDA stream (passed as
// void* so that this header needs no CUDA headers; nullptr: the default
// stream). Built with --fmad=false and IEEE division and square root, each
// kernel does the CPU's operations in the CPU's order, so the results are the
// same bits (tests/kernels_cuda_test.cc checks exactly that where a GPU is).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/update.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::kernels::cuda {

Status ApplyUpdate(UpdateRule rule, DType dtype, void* dst, const void* src, size_t n,
                   void* stream);
Status Accumulate(DType dtype, void* acc, const void* grad, size_t n, bool first, void* stream);
// Scales the f32/f64 sum in place; for f16/bf16 writes the rounded gradient
// to `out_half` (n elements of 2 bytes, on the device).
Status FinishAccumulation(DType dtype, void* acc, size_t n, double scale, void* out_half,
                          void* stream);
Status ApplyOptimizer(UpdateRule rule, const Hyperparams& h, DType dtype, void* param,
                      const void* grad, size_t n, const RuleState& state, uint64_t step,
                      void* stream);
// Waits for the stream; reports any error of the kernels enqueued on it.
Status Synchronize(void* stream);

}  // namespace tessera::kernels::cuda
