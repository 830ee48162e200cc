// The CUDA runtime as Tessera uses it: device memory (plain cudaMalloc, never
// managed memory), copies, streams, IPC handles and dmabuf export, behind
// Status values that name the CUDA error. This header needs no CUDA headers,
// and the library builds without CUDA too: then every call says that this
// build has no CUDA (meson -Dcuda=enabled with nvcc on PATH), so that callers
// need no #ifdefs and users get one clear reason.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/status.h"

namespace tessera::gpu {

// True when this build has CUDA (the answers below are then CUDA's own).
bool Built();

// A cudaError_t as a Status: OK for cudaSuccess, else `what` and CUDA's name
// and description of the error (the sticky last error is cleared).
Status CudaStatus(int cuda_error, const std::string& what);

// OK when this process can use a GPU; otherwise why not, e.g. "no usable
// GPU: cudaGetDeviceCount returned cudaErrorInsufficientDriver (...)" on a
// machine with the toolkit but no driver.
Status Available();
Result<int> DeviceCount();
// The calling thread's current device.
Result<int> CurrentDevice();
// Makes `device` current on the calling thread (CUDA's device is per thread).
Status SetDevice(int device);
// "NVIDIA H200 (device 0, sm_90, 139 GiB), CUDA runtime 13.0, driver 13.0".
Result<std::string> DescribeDevice(int device);
// Bytes of `device`'s memory free now (cudaMemGetInfo).
Result<uint64_t> FreeDeviceMemory(int device);

// Where a pointer lives, as CUDA sees it.
struct PointerInfo {
  bool device = false;  // device memory (cudaMalloc), usable only through CUDA
  int device_index = -1;
};
// Host memory CUDA does not know, and every pointer in a build without CUDA,
// is host memory.
PointerInfo QueryPointer(const void* ptr);
// Whether QueryPointer can ever say "device" in this process (a build with
// CUDA and a usable GPU), asked once: a batch's checks skip the per-buffer
// query when it cannot.
bool PointersMayBeDevice();

// Device memory from cudaMalloc on `device`, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Allocate(size_t bytes, int device);
  // On the calling thread's current device.
  static Result<DeviceBuffer> AllocateOnCurrentDevice(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
};

// A non-blocking stream on one device, destroyed with it. Copies and kernels
// enqueued on it run in order; Synchronize waits and reports their error.
class Stream {
 public:
  Stream() = default;
  static Result<Stream> Create(int device);
  ~Stream();
  Stream(Stream&& other) noexcept { *this = std::move(other); }
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The cudaStream_t, as the kernels/ interface takes it.
  void* handle() const { return stream_; }
  int device() const { return device_; }
  Status Synchronize() const;

 private:
  void* stream_ = nullptr;
  int device_ = -1;
};

// Asynchronous on `stream` (cudaMemcpyDefault: any direction); the bytes are
// there once the stream is synchronised. Host memory that is not pinned makes
// CUDA copy synchronously, which is correct, only slower.
Status Copy(void* dst, const void* src, size_t bytes, const Stream& stream);
Status Zero(void* dst, size_t bytes, const Stream& stream);

// CUDA IPC: another process on the same node maps device memory by this
// handle (cudaIpcGetMemHandle of the allocation's base).
using IpcHandle = std::array<uint8_t, 64>;
Result<IpcHandle> ExportIpc(void* device_ptr);

// A peer's allocation mapped into this process (cudaIpcOpenMemHandle on
// `device`), unmapped on destruction. A process cannot map its own memory.
class IpcMapping {
 public:
  IpcMapping() = default;
  static Result<IpcMapping> Open(const uint8_t* handle, size_t handle_bytes, int device);
  ~IpcMapping();
  IpcMapping(IpcMapping&& other) noexcept { *this = std::move(other); }
  IpcMapping& operator=(IpcMapping&& other) noexcept;
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;

  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
};

// A dmabuf file descriptor for device memory, so that an RDMA NIC can
// register it (ibv_reg_dmabuf_mr) without the peer-memory module. The fd
// covers the whole allocation holding [ptr, ptr+bytes); `offset` is ptr's
// place in it. The caller closes the fd.
struct Dmabuf {
  int fd = -1;
  uint64_t offset = 0;
};
Result<Dmabuf> ExportDmabuf(const void* ptr, size_t bytes);

}  // namespace tessera::gpu
