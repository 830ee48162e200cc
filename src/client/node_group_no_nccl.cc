// NodeGroup in a build without NCCL: every call says so.
#include "tessera/node_group.h"

namespace tessera {
namespace {

Status NotBuilt() {
  return Status::Unimplemented(
      "this build of Tessera has no NCCL (meson -Dnccl=enabled with NCCL installed, or "
      "-Dnccl_prefix=DIR; docs/gpu.md)");
}

}  // namespace

class NodeGroup::Impl {};

Result<NodeGroupId> NewNodeGroupId() { return NotBuilt(); }
Result<std::unique_ptr<NodeGroup>> NodeGroup::Create(Client&, const NodeGroupOptions&) {
  return NotBuilt();
}
NodeGroup::NodeGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeGroup::~NodeGroup() = default;
Status NodeGroup::Push(Tensor, const void*, uint64_t) { return NotBuilt(); }
Status NodeGroup::Pull(Tensor, void*, uint64_t, uint64_t) { return NotBuilt(); }
int NodeGroup::local_rank() const { return 0; }
int NodeGroup::local_size() const { return 1; }

}  // namespace tessera
