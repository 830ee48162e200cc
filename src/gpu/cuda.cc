// src/gpu/cuda.h on the CUDA runtime. Driver calls go through
// cudaGetDriverEntryPoint, so nothing links libcuda.so: a machine with the
// toolkit and no driver runs the binaries and gets CUDA's reason instead.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <utility>

#include "gpu/cuda.h"
#include "gpu/cuda_internal.h"

namespace tessera::gpu {

Status CudaStatus(int cuda_error, const std::string& what) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // the error is reported here; later calls must not see it
  switch (err) {
    case cudaErrorMemoryAllocation:
      return Status::ResourceExhausted(what + ": " + Describe(err));
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
      return Status::InvalidArgument(what + ": " + Describe(err));
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
      return Status::Unavailable(what + ": " + Describe(err));
    default:
      return Status::Internal(what + ": " + Describe(err));
  }
}

namespace {

cudaStream_t AsStream(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

}  // namespace

bool Built() { return true; }

Status Available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable("no usable GPU: cudaGetDeviceCount returned " + Describe(err));
  }
  if (count == 0) return Status::Unavailable("no usable GPU: cudaGetDeviceCount found none");
  return Status::Ok();
}

Result<int> DeviceCount() {
  if (Status st = Available(); !st.ok()) return st;
  int count = 0;
  if (Status st = Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !st.ok()) return st;
  return count;
}

Result<int> CurrentDevice() {
  if (Status st = Available(); !st.ok()) return st;
  int device = 0;
  if (Status st = Check(cudaGetDevice(&device), "cudaGetDevice"); !st.ok()) return st;
  return device;
}

Status SetDevice(int device) {
  const cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  int count = 0;
  if (err == cudaErrorInvalidDevice && cudaGetDeviceCount(&count) == cudaSuccess) {
    return Status::InvalidArgument("GPU " + std::to_string(device) +
                                   " does not exist (this machine has " + std::to_string(count) +
                                   ")");
  }
  if (Status st = Available(); !st.ok()) return st;
  return Check(err, "cudaSetDevice(" + std::to_string(device) + ")");
}

Result<uint64_t> FreeDeviceMemory(int device) {
  if (Status st = SetDevice(device); !st.ok()) return st;
  size_t free_bytes = 0, total = 0;
  if (Status st = Check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo"); !st.ok()) {
    return st;
  }
  return static_cast<uint64_t>(free_bytes);
}

Result<std::string> DescribeDevice(int device) {
  if (Status st = SetDevice(device); !st.ok()) return st;
  cudaDeviceProp prop{};
  if (Status st = Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
      !st.ok()) {
    return st;
  }
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  return std::string(prop.name) + " (device " + std::to_string(device) + ", sm_" +
         std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB), CUDA runtime " + version(runtime) +
         ", driver " + version(driver);
}

bool PointersMayBeDevice() {
  // Without a usable GPU every pointer is host memory; asking CUDA each
  // time would retry its initialisation on every call.
  static const bool usable = Available().ok();
  return usable;
}

PointerInfo QueryPointer(const void* ptr) {
  if (!PointersMayBeDevice()) return {};
  cudaPointerAttributes attr{};
  if (ptr == nullptr || cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // no driver, or memory CUDA never saw: host memory
    return {};
  }
  if (attr.type == cudaMemoryTypeDevice) return {true, attr.device};
  return {};
}

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, int device) {
  if (Status st = SetDevice(device); !st.ok()) return st;
  DeviceBuffer b;
  Status st =
      Check(cudaMalloc(&b.data_, bytes == 0 ? 1 : bytes),
            "cudaMalloc of " + std::to_string(bytes) + " bytes on GPU " + std::to_string(device));
  if (!st.ok()) return st;
  b.size_ = bytes;
  b.device_ = device;
  return b;
}

Result<DeviceBuffer> DeviceBuffer::AllocateOnCurrentDevice(size_t bytes) {
  auto device = CurrentDevice();
  if (!device.ok()) return device.status();
  return Allocate(bytes, *device);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

Result<Stream> Stream::Create(int device) {
  if (Status st = SetDevice(device); !st.ok()) return st;
  Stream s;
  cudaStream_t handle = nullptr;
  Status st = Check(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!st.ok()) return st;
  s.stream_ = handle;
  s.device_ = device;
  return s;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

Status Stream::Synchronize() const {
  return Check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

Status Copy(void* dst, const void* src, size_t bytes, const Stream& stream) {
  if (bytes == 0) return Status::Ok();
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)),
               "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
}

Status Zero(void* dst, size_t bytes, const Stream& stream) {
  if (bytes == 0) return Status::Ok();
  return Check(cudaMemsetAsync(dst, 0, bytes, AsStream(stream)), "cudaMemsetAsync");
}

Result<IpcHandle> ExportIpc(void* device_ptr) {
  cudaIpcMemHandle_t handle{};
  Status st = Check(cudaIpcGetMemHandle(&handle, device_ptr), "cudaIpcGetMemHandle");
  if (!st.ok()) return st;
  static_assert(sizeof(handle) == sizeof(IpcHandle));
  IpcHandle out{};
  std::memcpy(out.data(), &handle, out.size());
  return out;
}

Result<IpcMapping> IpcMapping::Open(const uint8_t* handle, size_t handle_bytes, int device) {
  cudaIpcMemHandle_t h{};
  if (handle_bytes != sizeof(h)) {
    return Status::InvalidArgument("a CUDA IPC handle has " + std::to_string(sizeof(h)) +
                                   " bytes, not " + std::to_string(handle_bytes));
  }
  if (Status st = SetDevice(device); !st.ok()) return st;
  std::memcpy(&h, handle, sizeof(h));
  void* mapped = nullptr;
  Status st = Check(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess),
                    "cudaIpcOpenMemHandle");
  if (!st.ok()) return st;
  IpcMapping m;
  m.data_ = static_cast<uint8_t*>(mapped);
  return m;
}

IpcMapping::~IpcMapping() {
  if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
}

IpcMapping& IpcMapping::operator=(IpcMapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

Result<Dmabuf> ExportDmabuf(const void* ptr, size_t bytes) {
  if (Status st = Available(); !st.ok()) return st;
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  using GetHandle =
      CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  auto get_range = DriverEntry<GetRange>("cuMemGetAddressRange", 3020);
  if (!get_range.ok()) return get_range.status();
  auto get_handle = DriverEntry<GetHandle>("cuMemGetHandleForAddressRange", 11070);
  if (!get_handle.ok()) return get_handle.status();
  CUdeviceptr base = 0;
  size_t size = 0;
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  if (Status st = CheckDriver((*get_range)(&base, &size, addr), "cuMemGetAddressRange"); !st.ok()) {
    return st;
  }
  if (addr + bytes > base + size) {
    return Status::InvalidArgument("GPU range of " + std::to_string(bytes) +
                                   " bytes runs past its allocation");
  }
  int fd = -1;
  // The dmabuf covers whole pages of the allocation: export all of it.
  if (Status st =
          CheckDriver((*get_handle)(&fd, base, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                      "cuMemGetHandleForAddressRange(DMA_BUF_FD)");
      !st.ok()) {
    return st.WithContext(
        "exporting GPU memory as a dmabuf (needs the NVIDIA open kernel modules and Linux >= "
        "5.12)");
  }
  return Dmabuf{fd, addr - base};
}

}  // namespace tessera::gpu
