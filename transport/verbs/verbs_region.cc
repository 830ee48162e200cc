// Registered memory for the verbs backend: regions registered on every device
// the context opened, their self-checking descriptions (one rkey per device,
// named by its node GUID), and attached remote regions.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/bytes.h"
#include "gpu/cuda.h"
#include "transport/region_desc.h"
#include "transport/run_on_loop.h"
#include "transport/verbs/verbs_context.h"
#include "transport/verbs/verbs_errors.h"

namespace tessera::transport::verbs {

class VerbsRegion final : public Region {
 public:
  VerbsRegion(std::shared_ptr<DeviceSet> devs, void* data, size_t size, MemoryKind kind, bool owned)
      : devs_(std::move(devs)), data_(data), size_(size), kind_(kind), owned_(owned) {}
  ~VerbsRegion() override {
    {
      std::lock_guard<std::mutex> lock(devs_->regions_mu);
      devs_->regions.erase(reinterpret_cast<uintptr_t>(data_));
    }
    // The window first: it holds its registration.
    if (window_ != nullptr) ibv_dealloc_mw(window_);
    for (auto& [dev, mr] : mrs_) ibv_dereg_mr(mr);
    if (owned_) std::free(data_);
    // owned_gpu_, a member, is freed after this: after the deregistrations.
  }
  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  MemoryKind kind() const override { return kind_; }
  std::vector<uint8_t> Describe() const override { return desc_; }
  Status TakeWritesOnlyFrom(Endpoint& writer) override;

  uint32_t lkey(const Device* dev) const {
    for (const auto& [d, mr] : mrs_) {
      if (d == dev) return mr->lkey;
    }
    return 0;
  }

 private:
  friend class VerbsContext;
  std::shared_ptr<DeviceSet> devs_;
  void* data_;
  size_t size_;
  MemoryKind kind_;
  bool owned_;
  // Registers the memory again on every device with `flags`, and on
  // `writer_dev` with `writer_flags`; the new registrations, or none.
  Result<std::vector<std::pair<const Device*, ibv_mr*>>> Reregister(const Device* writer_dev,
                                                                    int flags, int writer_flags);

  std::vector<std::pair<const Device*, ibv_mr*>> mrs_;
  ibv_mw* window_ = nullptr;  // TakeWritesOnlyFrom's, bound to the writer's queue pair
  std::vector<uint8_t> desc_;
  gpu::DeviceBuffer owned_gpu_;  // Allocate(kCuda)
};

namespace {

// The peer-memory modules that let ibv_reg_mr take GPU addresses.
std::string LoadedPeerMemoryModule() {
  for (const char* m : {"nvidia_peermem", "nv_peer_mem"}) {
    std::error_code ec;
    if (std::filesystem::exists(std::string("/sys/module/") + m, ec)) return m;
  }
  return "";
}

}  // namespace

// GPU memory on one device: a dmabuf export registered with
// ibv_reg_dmabuf_mr where the driver and kernel allow it, else plain
// ibv_reg_mr where a peer-memory module resolves GPU addresses; otherwise an
// error that names both attempts, so that nothing fails later instead.
Result<ibv_mr*> RegisterGpuMemory(const Device& dev, void* data, size_t size, int flags) {
  std::string dmabuf_why;
  auto dmabuf = gpu::ExportDmabuf(data, size);
  if (dmabuf.ok()) {
    ibv_mr* mr = ibv_reg_dmabuf_mr(dev.pd, dmabuf->offset, size, reinterpret_cast<uint64_t>(data),
                                   dmabuf->fd, flags);
    const int err = errno;
    ::close(dmabuf->fd);  // the MR holds its own reference
    if (mr != nullptr) return mr;
    dmabuf_why = std::string("ibv_reg_dmabuf_mr failed: ") + std::strerror(err) +
                 (err == EOPNOTSUPP || err == EPROTONOSUPPORT
                      ? " (this device or kernel cannot map dmabufs; Linux >= 5.12 and a "
                        "dmabuf-capable RDMA driver are needed)"
                      : "");
  } else {
    dmabuf_why = dmabuf.status().message();
  }
  std::string peer_why;
  if (const std::string module = LoadedPeerMemoryModule(); !module.empty()) {
    ibv_mr* mr = ibv_reg_mr(dev.pd, data, size, flags);
    if (mr != nullptr) return mr;
    peer_why = "ibv_reg_mr with " + module + " loaded failed: " + std::strerror(errno);
  } else {
    peer_why = "no peer-memory module is loaded (modprobe nvidia_peermem)";
  }
  return Status::Unimplemented("verbs backend: cannot register " + std::to_string(size) +
                               " bytes of GPU memory on " + dev.name + ": dmabuf: " + dmabuf_why +
                               "; peer memory: " + peer_why);
}

// A description's key for one device: its node GUID (8 bytes) and the
// rkey (4), little endian; Attach picks the one of the connection's device.
static void AppendKeyEntry(const Device& dev, uint32_t rkey, std::vector<uint8_t>* keys) {
  uint8_t entry[12];
  std::memcpy(entry, &dev.node_guid, 8);
  std::memcpy(entry + 8, &rkey, 4);
  keys->insert(keys->end(), entry, entry + sizeof(entry));
}

Result<std::vector<std::pair<const Device*, ibv_mr*>>> VerbsRegion::Reregister(
    const Device* writer_dev, int flags, int writer_flags) {
  std::vector<std::pair<const Device*, ibv_mr*>> fresh;
  for (const auto& [dev, old] : mrs_) {
    const int f = dev == writer_dev ? writer_flags : flags;
    Result<ibv_mr*> mr = kind_ == MemoryKind::kCuda
                             ? RegisterGpuMemory(*dev, data_, size_, f)
                             : Result<ibv_mr*>(ibv_reg_mr(dev->pd, data_, size_, f));
    if (mr.ok() && *mr == nullptr) mr = RegistrationError(errno, size_, "a region on " + dev->name);
    if (!mr.ok()) {
      for (auto& [d, m] : fresh) ibv_dereg_mr(m);
      return mr.status();
    }
    fresh.push_back({dev, *mr});
  }
  return fresh;
}

// A slot for one writer: its memory registered again with no remote access
// at all (the old rkeys die with the old registrations), and a type-2
// window over it, bound to the writer's queue pair, whose rkey is the only
// key the description then holds. The HCA refuses that rkey on any other
// queue pair (a remote access error there).
Status VerbsRegion::TakeWritesOnlyFrom(Endpoint& writer) {
  auto* ep = dynamic_cast<VerbsEndpoint*>(&writer);
  if (ep == nullptr) return Status::InvalidArgument("verbs: the writer is not a verbs connection");
  if (window_ != nullptr) return Status::FailedPrecondition("verbs: the region has a writer");
  auto dev = ep->device();
  if (!dev.ok()) return dev.status();
  if (!(*dev)->qp_bound_windows) {
    return Status::Unimplemented(
        "verbs: " + (*dev)->name +
        " has no type-2B memory windows, so a registration cannot be tied to one queue pair: "
        "any connection holding its rkey may write it (docs/security.md)");
  }
  auto fresh =
      Reregister(*dev, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  if (!fresh.ok()) return fresh.status().WithContext("verbs: registering a slot for one writer");
  ibv_mr* writer_mr = nullptr;
  for (const auto& [d, mr] : *fresh) {
    if (d == *dev) writer_mr = mr;
  }
  ibv_mw* window = writer_mr != nullptr ? ibv_alloc_mw((*dev)->pd, IBV_MW_TYPE_2) : nullptr;
  Result<uint32_t> rkey =
      window != nullptr
          ? ep->BindWindow(window, writer_mr, data_, size_)
          : Result<uint32_t>(Status::Internal("verbs: ibv_alloc_mw on " + (*dev)->name +
                                              " failed: " + std::strerror(errno)));
  if (!rkey.ok()) {
    if (window != nullptr) ibv_dealloc_mw(window);
    for (auto& [d, mr] : *fresh) ibv_dereg_mr(mr);
    return rkey.status();
  }
  auto old = std::move(mrs_);
  {
    std::lock_guard<std::mutex> lock(devs_->regions_mu);  // FindLkey reads the lkeys
    mrs_ = std::move(*fresh);
  }
  for (auto& [d, mr] : old) ibv_dereg_mr(mr);
  window_ = window;
  std::vector<uint8_t> keys;
  AppendKeyEntry(**dev, *rkey, &keys);
  desc_ = EncodeRegionDesc(BackendId::kVerbs, reinterpret_cast<uint64_t>(data_), size_, keys);
  return Status::Ok();
}

class VerbsRemoteRegion final : public RemoteRegion {
 public:
  VerbsRemoteRegion(const VerbsEndpoint* owner, uint64_t base, uint64_t size, uint32_t rkey)
      : owner_(owner), base_(base), size_(size), rkey_(rkey) {}
  uint64_t base() const override { return base_; }
  uint64_t size() const override { return size_; }
  uint32_t rkey() const { return rkey_; }
  const VerbsEndpoint* owner() const { return owner_; }

 private:
  const VerbsEndpoint* owner_;
  uint64_t base_, size_;
  uint32_t rkey_;
};

Result<std::unique_ptr<Region>> VerbsContext::Allocate(size_t size, MemoryKind kind,
                                                       RemoteAccess access) {
  if (kind == MemoryKind::kCuda) {
    if (Status st = CanRegister(kind); !st.ok()) return st;
    auto buffer = gpu::DeviceBuffer::AllocateOnCurrentDevice(size);
    if (!buffer.ok()) return buffer.status();
    auto region = MapRegion(buffer->data(), size, kind, access, /*owned=*/false);
    if (!region.ok()) return region.status();
    static_cast<VerbsRegion*>(region->get())->owned_gpu_ = std::move(*buffer);
    return region;
  }
  if (size == 0) return Status::InvalidArgument("cannot allocate an empty region");
  void* data = std::aligned_alloc(4096, AlignUp(size, 4096));
  if (data == nullptr) return Status::ResourceExhausted("allocating " + std::to_string(size));
  std::memset(data, 0, size);
  return MapRegion(data, size, kind, access, /*owned=*/true);
}

Result<std::unique_ptr<Region>> VerbsContext::Register(void* data, size_t size, MemoryKind kind,
                                                       RemoteAccess access) {
  if (data == nullptr) return Status::InvalidArgument("register: null buffer");
  return MapRegion(data, size, kind, access, /*owned=*/false);
}

Result<std::unique_ptr<Region>> VerbsContext::MapRegion(void* data, size_t size, MemoryKind kind,
                                                        RemoteAccess access, bool owned) {
  if (Status st = CanRegister(kind); !st.ok()) {
    if (owned) std::free(data);
    return st;
  }
  if (size == 0) return Status::InvalidArgument("cannot register an empty region");
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (static_cast<uint8_t>(access) & static_cast<uint8_t>(RemoteAccess::kRead)) {
    flags |= IBV_ACCESS_REMOTE_READ;
  }
  if (static_cast<uint8_t>(access) & static_cast<uint8_t>(RemoteAccess::kWrite)) {
    flags |= IBV_ACCESS_REMOTE_WRITE;
  }
  std::unique_ptr<VerbsRegion> region(new VerbsRegion(devs_, data, size, kind, owned));
  std::vector<uint8_t> keys;
  for (const auto& dev : devices_) {
    ibv_mr* mr = nullptr;
    if (kind == MemoryKind::kCuda) {
      auto gpu_mr = RegisterGpuMemory(*dev, data, size, flags);
      if (!gpu_mr.ok()) return gpu_mr.status();
      mr = *gpu_mr;
    } else {
      mr = ibv_reg_mr(dev->pd, data, size, flags);
    }
    if (mr == nullptr) return RegistrationError(errno, size, "a region on " + dev->name);
    region->mrs_.push_back({dev.get(), mr});
    AppendKeyEntry(*dev, mr->rkey, &keys);
  }
  region->desc_ = EncodeRegionDesc(BackendId::kVerbs, reinterpret_cast<uint64_t>(data), size, keys);
  {
    std::lock_guard<std::mutex> lock(devs_->regions_mu);
    devs_->regions[reinterpret_cast<uintptr_t>(data)] = region.get();
  }
  return std::unique_ptr<Region>(std::move(region));
}

Status VerbsContext::CanRegister(MemoryKind kind) const {
  if (kind == MemoryKind::kHost) return Status::Ok();
  // Whether dmabuf or peer memory works shows only when an allocation is
  // registered (RegisterGpuMemory says which failed and why).
  return gpu::Available().WithContext("verbs backend: registering GPU memory");
}

uint32_t VerbsContext::FindLkey(const Device& dev, const void* data, size_t len) const {
  const auto addr = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(devs_->regions_mu);
  auto it = devs_->regions.upper_bound(addr);
  if (it == devs_->regions.begin()) return 0;
  --it;
  const VerbsRegion* r = it->second;
  if (addr - it->first > r->size() || len > r->size() - (addr - it->first)) return 0;
  return r->lkey(&dev);
}

Result<std::unique_ptr<RemoteRegion>> VerbsEndpoint::Attach(std::span<const uint8_t> description) {
  auto desc = DecodeRegionDesc(description);
  if (!desc.ok()) return desc.status().WithContext("from " + peer_);
  if (desc->backend != BackendId::kVerbs) {
    return Status::InvalidArgument("remote key from " + peer_ + " is not a verbs key");
  }
  if (desc->key.size() % 12 != 0 || desc->key.empty()) {
    return Status::InvalidArgument("remote key from " + peer_ + " is malformed");
  }
  return RunOnLoop(*ctx_, [&]() -> Result<std::unique_ptr<RemoteRegion>> {
    if (dead_ || qp_ == nullptr) return DeadStatus();
    for (size_t i = 0; i < desc->key.size(); i += 12) {
      uint64_t guid;
      uint32_t rkey;
      std::memcpy(&guid, desc->key.data() + i, 8);
      std::memcpy(&rkey, desc->key.data() + i + 8, 4);
      if (guid == remote_guid_) {
        return std::unique_ptr<RemoteRegion>(
            new VerbsRemoteRegion(this, desc->base, desc->size, rkey));
      }
    }
    return Status::InvalidArgument("remote key from " + peer_ +
                                   " has no key for the device this connection uses");
  });
}

// The rkey of a region attached to `ep`, or an error.
Result<uint32_t> RemoteKeyFor(const VerbsEndpoint* ep, const RemoteRegion& remote, uint64_t addr,
                              size_t len, const std::string& peer) {
  const auto* r = dynamic_cast<const VerbsRemoteRegion*>(&remote);
  if (r == nullptr || r->owner() != ep) {
    return Status::InvalidArgument("remote region was not attached to the endpoint of " + peer);
  }
  if (!remote.Contains(addr, len)) {
    return Status::OutOfRange("one-sided access of " + std::to_string(len) + " bytes at " +
                              std::to_string(addr) + " lies outside the region of " + peer);
  }
  return r->rkey();
}

}  // namespace tessera::transport::verbs
