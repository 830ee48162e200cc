// The workers of one node as one: BytePS's intra-node scheme over NCCL.
// Each gradient is summed over the node's GPUs (a reduce of every chunk to
// the local rank that owns it, together a reduce-scatter), each local rank
// pushes only the chunks it owns, pulls only those, and the node's ranks
// then all-gather the tensor (a broadcast of every chunk from its owner).
// Every byte crosses the network once per node instead of once per GPU.
//
// Chunk i of a tensor belongs to local rank i % local_size (ChunkPart), so
// a tensor of fewer chunks than local ranks is pushed by fewer ranks:
// declare with a chunk_bytes that splits the large tensors.
//
// Sync tensors: each chunk receives one push per node per step, so
// replicas_to_aggregate counts nodes; `average` divides the node's sum by
// local_size first (NCCL's ncclAvg), so that averaging over nodes gives the
// average over all GPUs. Bounded staleness is refused: it counts every
// worker's pushes per chunk, and here one rank per node pushes each chunk.
//
// Needs a build with NCCL (meson -Dnccl=enabled, or auto where nccl.h is);
// without one, Create says so. Buffers are GPU memory on cuda_device.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "tessera/client.h"
#include "tessera/export.h"
#include "tessera/status.h"

namespace tessera {

// NCCL's unique id: made by local rank 0, handed to the others out of band.
using NodeGroupId = std::array<uint8_t, 128>;
TESSERA_EXPORT Result<NodeGroupId> NewNodeGroupId();

struct TESSERA_EXPORT NodeGroupOptions {
  int local_rank = 0;
  int local_size = 1;
  NodeGroupId id{};
  int cuda_device = 0;
  bool average = false;  // divide the node's sum by local_size
};

class TESSERA_EXPORT NodeGroup {
 public:
  // Joins the node's group (every local rank calls it; it returns once all
  // have). `client` is this rank's own and must outlive the group.
  static Result<std::unique_ptr<NodeGroup>> Create(Client& client, const NodeGroupOptions& options);
  ~NodeGroup();

  // Sums `gradient` (the whole tensor, GPU memory) over the node and pushes
  // this rank's chunks of the sum.
  Status Push(Tensor t, const void* gradient, uint64_t step = 0);
  // Pulls this rank's chunks into `weights` (the whole tensor, GPU memory),
  // then gathers the others' from them: every rank ends with the tensor.
  // min_version and min_step as PullItem's.
  Status Pull(Tensor t, void* weights, uint64_t min_version = 1, uint64_t min_step = 0);

  int local_rank() const;
  int local_size() const;

 private:
  class Impl;
  explicit NodeGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
