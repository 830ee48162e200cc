// src/gpu/cuda.h in a build without CUDA: every GPU operation reports that
// this build has none, and every pointer is host memory.
#include <utility>

#include "gpu/cuda.h"
#include "gpu/stream_order.h"

namespace tessera::gpu {
namespace {

Status NotBuilt() {
  return Status::Unimplemented(
      "this build of Tessera has no CUDA (configure with meson -Dcuda=enabled and nvcc on PATH)");
}

}  // namespace

bool Built() { return false; }
Status CudaStatus(int cuda_error, const std::string& what) {
  if (cuda_error == 0) return Status::Ok();
  return Status::Internal(what + ": CUDA error " + std::to_string(cuda_error));
}
Status Available() { return NotBuilt(); }
Result<int> DeviceCount() { return NotBuilt(); }
Result<int> CurrentDevice() { return NotBuilt(); }
Status SetDevice(int) { return NotBuilt(); }
Result<std::string> DescribeDevice(int) { return NotBuilt(); }
Result<uint64_t> FreeDeviceMemory(int) { return NotBuilt(); }
PointerInfo QueryPointer(const void*) { return {}; }
bool PointersMayBeDevice() { return false; }

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t, int) { return NotBuilt(); }
Result<DeviceBuffer> DeviceBuffer::AllocateOnCurrentDevice(size_t) { return NotBuilt(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }

Result<Stream> Stream::Create(int) { return NotBuilt(); }
Stream::~Stream() = default;
Stream& Stream::operator=(Stream&&) noexcept { return *this; }
Status Stream::Synchronize() const { return NotBuilt(); }

Status Copy(void*, const void*, size_t, const Stream&) { return NotBuilt(); }
Status Zero(void*, size_t, const Stream&) { return NotBuilt(); }

Result<IpcHandle> ExportIpc(void*) { return NotBuilt(); }
Result<IpcMapping> IpcMapping::Open(const uint8_t*, size_t, int) { return NotBuilt(); }
IpcMapping::~IpcMapping() = default;
IpcMapping& IpcMapping::operator=(IpcMapping&&) noexcept { return *this; }
Result<Dmabuf> ExportDmabuf(const void*, size_t) { return NotBuilt(); }

Status EnqueueHostCall(void*, std::function<void()>) { return NotBuilt(); }
Result<StreamFlag> StreamFlag::Take() { return NotBuilt(); }
Status StreamFlag::EnqueueWait(void*) { return NotBuilt(); }
StreamFlag& StreamFlag::operator=(StreamFlag&& other) noexcept {
  slot_ = std::exchange(other.slot_, -1);
  value_ = other.value_;
  device_address_ = other.device_address_;
  return *this;
}
void StreamFlag::Set() { slot_ = -1; }

}  // namespace tessera::gpu
