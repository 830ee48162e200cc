// What the CUDA-built files of src/gpu share: CUDA's errors as Status
// values, and the driver's entry points found through the runtime.
// Included only where CUDA's headers are.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "gpu/cuda.h"

namespace tessera::gpu {

inline std::string Describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

inline Status Check(cudaError_t err, const std::string& what) { return CudaStatus(err, what); }

// Driver entry points, found through the runtime so that nothing links
// libcuda.so (absent where only the toolkit is installed).
template <typename Fn>
Result<Fn> DriverEntry(const char* symbol, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  Status st =
      Check(cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found),
            std::string("finding the driver's ") + symbol);
  if (!st.ok()) return st;
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return Status::Unimplemented(std::string("this CUDA driver has no ") + symbol +
                                 " (too old for it)");
  }
  return reinterpret_cast<Fn>(fn);
}

inline Status CheckDriver(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  // cuGetErrorName would need another entry point; the number is in cuda.h.
  return Status::Internal(what + ": CUresult " + std::to_string(static_cast<int>(r)));
}

}  // namespace tessera::gpu
