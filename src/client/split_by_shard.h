// A call's items (push, pull or push_pull) split into each shard's chunks,
// after checking each item's buffer, size and dtype against the tensor it
// names: the first step of every data call, before FanOut.
#pragma once

#include <vector>

#include "client/chunk_io.h"
#include "client/tensor_table.h"
#include "tessera/client.h"

namespace tessera::client {

// The error for a sync tensor in a call that cannot carry its step. A
// plain function, called for sync tensors only: nothing per item beyond
// the checks themselves.
using RefuseSync = Status (*)(const TensorEntry&);

// Splits by the items' ChunkParts only; a sync tensor is refused with
// `refuse_sync(entry)`'s error unless that is null. `what` names the call
// in errors. Holds the table's lock once for the whole call.
template <typename Item>
Result<ByShard> SplitByShard(const TensorTable& tensors, size_t num_shards,
                             const std::vector<Item>& items, const char* what,
                             RefuseSync refuse_sync);

}  // namespace tessera::client
