#include "server/held_rows.h"

namespace tessera::server {

Status HeldRows::CheckPlaced(std::span<const int64_t> ids, const RowPlacement& placement,
                             int this_task) const {
  for (int64_t id : ids) {
    const int shard = placement.ShardOf(id);
    if (shard != this_task) {
      return Status::InvalidArgument("id " + std::to_string(id) + " of " + Describe() +
                                     " is ps task " + std::to_string(shard) + "'s, not ps task " +
                                     std::to_string(this_task) + "'s");
    }
  }
  return Status::Ok();
}

std::string HeldRows::Describe() const {
  return "embedding table '" + decl.name + "' (dim " + std::to_string(decl.dim) + ", " +
         DTypeName(decl.dtype) + ")";
}

}  // namespace tessera::server
