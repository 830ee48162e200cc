// UCX's registered memory (ucp_mem_map) and the peers' keys to it.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <vector>

#include "gpu/cuda.h"
#include "transport/transport.h"

namespace tessera::transport::ucx {

// ucp_context_h outlives the Context object while regions still use it.
struct UcpContextHolder {
  ucp_context_h handle = nullptr;
  ~UcpContextHolder() {
    if (handle) ucp_cleanup(handle);
  }
};

class UcxEndpoint;

class UcxRegion final : public Region {
 public:
  UcxRegion(std::shared_ptr<UcpContextHolder> ctx, ucp_mem_h memh, void* data, size_t size,
            MemoryKind kind, std::vector<uint8_t> desc, gpu::DeviceBuffer owned_gpu)
      : ctx_(std::move(ctx)),
        memh_(memh),
        data_(data),
        size_(size),
        kind_(kind),
        desc_(std::move(desc)),
        owned_gpu_(std::move(owned_gpu)) {}
  ~UcxRegion() override { ucp_mem_unmap(ctx_->handle, memh_); }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  MemoryKind kind() const override { return kind_; }
  std::vector<uint8_t> Describe() const override { return desc_; }
  Status TakeWritesOnlyFrom(Endpoint&) override {
    return Status::Unimplemented(
        "UCX cannot tie a registration to one endpoint: any peer holding its key may write it "
        "(docs/security.md)");
  }
  void AdoptGpuBuffer(gpu::DeviceBuffer buffer) { owned_gpu_ = std::move(buffer); }

 private:
  std::shared_ptr<UcpContextHolder> ctx_;
  ucp_mem_h memh_;
  void* data_;
  size_t size_;
  MemoryKind kind_;
  std::vector<uint8_t> desc_;
  gpu::DeviceBuffer owned_gpu_;  // Allocate(kCuda): freed after the unmap
};

class UcxRemoteRegion final : public RemoteRegion {
 public:
  // `mapped`: the region's first byte in this process, where UCX maps the
  // peer's memory (shared memory) and the endpoint may copy itself; null
  // where it does not.
  UcxRemoteRegion(const UcxEndpoint* owner, ucp_rkey_h rkey, uint64_t base, uint64_t size,
                  uint8_t* mapped)
      : owner_(owner), rkey_(rkey), base_(base), size_(size), mapped_(mapped) {}
  ~UcxRemoteRegion() override { ucp_rkey_destroy(rkey_); }
  uint64_t base() const override { return base_; }
  uint64_t size() const override { return size_; }
  ucp_rkey_h rkey() const { return rkey_; }
  const UcxEndpoint* owner() const { return owner_; }
  // Where remote address `addr` of the region lies here, if mapped().
  uint8_t* mapped() const { return mapped_; }
  uint8_t* MappedAt(uint64_t addr) const { return mapped_ + (addr - base_); }

 private:
  const UcxEndpoint* owner_;
  ucp_rkey_h rkey_;
  uint64_t base_;
  uint64_t size_;
  uint8_t* mapped_;  // the rkey keeps the mapping: valid until its destroy
};

}  // namespace tessera::transport::ucx
