// NodeGroup on NCCL (include/tessera/node_group.h).
#include "tessera/node_group.h"

#include <nccl.h>

#include <cstring>
#include <string>

#include "gpu/cuda.h"

namespace tessera {
namespace {

Status FromNccl(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return Status::Ok();
  std::string msg = what + ": " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') {
    msg += std::string(" (") + last + ")";
  }
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? Status::InvalidArgument(msg)
                                                           : Status::Internal(msg);
}

Result<ncclDataType_t> NcclType(DType d) {
  switch (d) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
  }
  return Status::InvalidArgument("no NCCL type for this dtype");
}

}  // namespace

Result<NodeGroupId> NewNodeGroupId() {
  ncclUniqueId id;
  TESSERA_RETURN_IF_ERROR(FromNccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  static_assert(sizeof(id) == sizeof(NodeGroupId));
  NodeGroupId out;
  std::memcpy(out.data(), &id, out.size());
  return out;
}

class NodeGroup::Impl {
 public:
  Impl(Client& client, const NodeGroupOptions& o) : client_(client), o_(o) {}
  ~Impl() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  Status Init() {
    if (o_.local_size < 1 || o_.local_rank < 0 || o_.local_rank >= o_.local_size) {
      return Status::InvalidArgument("node group: local rank " + std::to_string(o_.local_rank) +
                                     " of " + std::to_string(o_.local_size));
    }
    TESSERA_RETURN_IF_ERROR(gpu::SetDevice(o_.cuda_device).WithContext("node group"));
    auto stream = gpu::Stream::Create(o_.cuda_device);
    if (!stream.ok()) return stream.status();
    stream_ = std::move(*stream);
    ncclUniqueId id;
    std::memcpy(&id, o_.id.data(), sizeof(id));
    return FromNccl(ncclCommInitRank(&comm_, o_.local_size, id, o_.local_rank),
                    "ncclCommInitRank (rank " + std::to_string(o_.local_rank) + " of " +
                        std::to_string(o_.local_size) + ")");
  }

  Status Push(Tensor t, const void* gradient, uint64_t step) {
    TESSERA_ASSIGN_OR_RETURN(const TensorInfo info, client_.info(t));
    TESSERA_RETURN_IF_ERROR(CheckTensor(info));
    auto type = NcclType(info.dtype);
    if (!type.ok()) return type.status();
    TESSERA_RETURN_IF_ERROR(gpu::SetDevice(o_.cuda_device));
    if (sum_.size() < info.bytes) {
      auto b = gpu::DeviceBuffer::Allocate(info.bytes, o_.cuda_device);
      if (!b.ok()) return b.status();
      sum_ = std::move(*b);
    }
    const ncclRedOp_t op = o_.average ? ncclAvg : ncclSum;
    const auto* src = static_cast<const uint8_t*>(gradient);
    auto* dst = static_cast<uint8_t*>(sum_.data());
    TESSERA_RETURN_IF_ERROR(PerChunk(info, "ncclReduce", [&](size_t at, size_t count, int owner) {
      return ncclReduce(src + at, dst + at, count, *type, op, owner, comm_, Stream());
    }));
    PushItem item{
        t,
        sum_.data(),
        info.bytes,
        info.dtype,
        BufferMemory::kCuda,
        ChunkPart{static_cast<uint32_t>(o_.local_rank), static_cast<uint32_t>(o_.local_size)}};
    return client_.Push({item}, {.step = step});
  }

  Status Pull(Tensor t, void* weights, uint64_t min_version, uint64_t min_step) {
    TESSERA_ASSIGN_OR_RETURN(const TensorInfo info, client_.info(t));
    TESSERA_RETURN_IF_ERROR(CheckTensor(info));
    auto type = NcclType(info.dtype);
    if (!type.ok()) return type.status();
    PullItem item{
        t,
        weights,
        info.bytes,
        min_version,
        info.dtype,
        min_step,
        BufferMemory::kCuda,
        ChunkPart{static_cast<uint32_t>(o_.local_rank), static_cast<uint32_t>(o_.local_size)}};
    TESSERA_RETURN_IF_ERROR(client_.Pull({item}));
    TESSERA_RETURN_IF_ERROR(gpu::SetDevice(o_.cuda_device));
    auto* w = static_cast<uint8_t*>(weights);
    return PerChunk(info, "ncclBroadcast", [&](size_t at, size_t count, int owner) {
      return ncclBroadcast(w + at, w + at, count, *type, owner, comm_, Stream());
    });
  }

  int local_rank() const { return o_.local_rank; }
  int local_size() const { return o_.local_size; }

 private:
  Status CheckTensor(const TensorInfo& info) const {
    if (info.chunks.empty()) return Status::InvalidArgument("node group: unknown tensor");
    if (info.mode.kind == Consistency::kBounded && o_.local_size > 1) {
      return Status::InvalidArgument(
          "node group: tensor '" + info.name +
          "' has bounded staleness, which counts every worker's pushes of each chunk; in a node "
          "group one rank per node pushes each chunk (use sync or async)");
    }
    return Status::Ok();
  }

  cudaStream_t Stream() const { return static_cast<cudaStream_t>(stream_.handle()); }

  // One collective per chunk of the tensor, rooted at the chunk's owner
  // (chunk i: local rank i % local_size), grouped into one NCCL launch;
  // returns once they are done. `call(byte offset, elements, owner)`.
  template <typename Call>
  Status PerChunk(const TensorInfo& info, const char* what, Call call) {
    const size_t es = DTypeSize(info.dtype);
    TESSERA_RETURN_IF_ERROR(FromNccl(ncclGroupStart(), "ncclGroupStart"));
    Status st;
    for (size_t i = 0; i < info.chunks.size() && st.ok(); ++i) {
      const auto& c = info.chunks[i];
      st = FromNccl(call(c.elem_offset * es, c.elem_count,
                         static_cast<int>(i % static_cast<size_t>(o_.local_size))),
                    std::string(what) + " of '" + info.name + "'");
    }
    Status end = FromNccl(ncclGroupEnd(), "ncclGroupEnd");
    TESSERA_RETURN_IF_ERROR(st);
    TESSERA_RETURN_IF_ERROR(end);
    return stream_.Synchronize();
  }

  Client& client_;
  NodeGroupOptions o_;
  ncclComm_t comm_ = nullptr;
  gpu::Stream stream_;
  gpu::DeviceBuffer sum_;  // the node's sum; this rank's chunks of it are pushed
};

Result<std::unique_ptr<NodeGroup>> NodeGroup::Create(Client& client,
                                                     const NodeGroupOptions& options) {
  auto impl = std::make_unique<Impl>(client, options);
  TESSERA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<NodeGroup>(new NodeGroup(std::move(impl)));
}

NodeGroup::NodeGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeGroup::~NodeGroup() = default;
Status NodeGroup::Push(Tensor t, const void* gradient, uint64_t step) {
  return impl_->Push(t, gradient, step);
}
Status NodeGroup::Pull(Tensor t, void* weights, uint64_t min_version, uint64_t min_step) {
  return impl_->Pull(t, weights, min_version, min_step);
}
int NodeGroup::local_rank() const { return impl_->local_rank(); }
int NodeGroup::local_size() const { return impl_->local_size(); }

}  // namespace tessera
