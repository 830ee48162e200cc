// src/gpu/stream_order.h on CUDA: host functions to start calls, waits on
// pinned flags to end them.
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "gpu/cuda_internal.h"
#include "gpu/stream_order.h"

namespace tessera::gpu {
namespace {

void RunHostCall(void* arg) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(arg));
  (*fn)();
}

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// Flags in pinned host memory that every device can read (portable,
// mapped). Each slot's value only grows: a wait for value v is satisfied by
// any later value too, so a slot set and taken again can never leave an
// older wait on it hanging. Made once and never freed.
class FlagPool {
 public:
  static FlagPool& Get() {
    static FlagPool* pool = new FlagPool();  // outlives every stream that may read it
    return *pool;
  }

  struct Flag {
    int slot;
    uint32_t value;  // what sets it
    CUdeviceptr device_address;
  };
  Result<Flag> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) TESSERA_RETURN_IF_ERROR(AddPage());
    const int slot = free_.back();
    free_.pop_back();
    const uint32_t value = ++next_[static_cast<size_t>(slot)];
    return Flag{slot, value, device_pages_[slot / kPerPage] + (slot % kPerPage) * sizeof(uint32_t)};
  }
  void Set(int slot, uint32_t value) {
    std::lock_guard<std::mutex> lock(mu_);
    std::atomic_ref<uint32_t>(pages_[slot / kPerPage][slot % kPerPage])
        .store(value, std::memory_order_release);
    free_.push_back(slot);
  }

 private:
  static constexpr int kPerPage = 1024;
  Status AddPage() {
    void* host = nullptr;
    TESSERA_RETURN_IF_ERROR(Check(cudaHostAlloc(&host, kPerPage * sizeof(uint32_t),
                                                cudaHostAllocPortable | cudaHostAllocMapped),
                                  "cudaHostAlloc of stream flags"));
    void* device = nullptr;
    Status st = Check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
    if (!st.ok()) {
      cudaFreeHost(host);
      return st;
    }
    auto* flags = static_cast<uint32_t*>(host);
    for (int i = 0; i < kPerPage; ++i) flags[i] = 0;
    const int first = static_cast<int>(pages_.size()) * kPerPage;
    pages_.push_back(flags);
    device_pages_.push_back(reinterpret_cast<CUdeviceptr>(device));
    next_.resize(next_.size() + kPerPage, 0);
    for (int i = kPerPage - 1; i >= 0; --i) free_.push_back(first + i);
    return Status::Ok();
  }

  std::mutex mu_;
  std::vector<uint32_t*> pages_;
  std::vector<CUdeviceptr> device_pages_;
  std::vector<uint32_t> next_;  // by slot: the last value handed out
  std::vector<int> free_;
};

Result<WaitValue32> WaitFunction() {
  static const Result<WaitValue32> fn = DriverEntry<WaitValue32>("cuStreamWaitValue32", 12000);
  return fn;
}

// CU_STREAM_WAIT_VALUE_FLUSH where the device has it: bytes a NIC wrote into
// GPU memory (GPUDirect RDMA) are then visible to the work after the wait.
unsigned int WaitFlags(cudaStream_t stream) {
  int device = 0, options = 0;
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess ||
      cudaDeviceGetAttribute(&options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return CU_STREAM_WAIT_VALUE_GEQ;
  }
  return (options & cudaFlushGPUDirectRDMAWritesOptionMemOps)
             ? CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH
             : CU_STREAM_WAIT_VALUE_GEQ;
}

}  // namespace

Status EnqueueHostCall(void* stream, std::function<void()> fn) {
  auto* owned = new std::function<void()>(std::move(fn));
  Status st = Check(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), &RunHostCall, owned),
                    "cudaLaunchHostFunc on the caller's stream");
  if (!st.ok()) delete owned;
  return st;
}

Result<StreamFlag> StreamFlag::Take() {
  auto wait = WaitFunction();
  if (!wait.ok()) return wait.status().WithContext("ordering a call on a CUDA stream");
  auto flag = FlagPool::Get().Take();
  if (!flag.ok()) return flag.status().WithContext("ordering a call on a CUDA stream");
  StreamFlag out;
  out.slot_ = flag->slot;
  out.value_ = flag->value;
  out.device_address_ = flag->device_address;
  return out;
}

Status StreamFlag::EnqueueWait(void* stream) {
  if (slot_ < 0) return Status::Internal("a stream flag waited on after it was set");
  const auto s = static_cast<cudaStream_t>(stream);
  return CheckDriver(
      (*WaitFunction())(reinterpret_cast<CUstream>(s), static_cast<CUdeviceptr>(device_address_),
                        value_, WaitFlags(s)),
      "cuStreamWaitValue32 on the caller's stream");
}

StreamFlag& StreamFlag::operator=(StreamFlag&& other) noexcept {
  if (this != &other) {
    Set();
    slot_ = std::exchange(other.slot_, -1);
    value_ = other.value_;
    device_address_ = other.device_address_;
  }
  return *this;
}

void StreamFlag::Set() {
  if (slot_ < 0) return;
  FlagPool::Get().Set(slot_, value_);
  slot_ = -1;
}

}  // namespace tessera::gpu
