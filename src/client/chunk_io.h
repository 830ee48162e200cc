// A call's chunks as the movers see them: each chunk with the caller's
// buffer it moves from or into, listed by shard, and how a part of a call
// reports its end. Lists come from the pool (core/pool_allocator.h), so a
// call's lists cost no allocation in steady state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "client/tensor_table.h"
#include "core/inline_function.h"
#include "core/pool_allocator.h"
#include "tessera/status.h"

namespace tessera::client {

struct ChunkIo {
  const Chunk* chunk;
  uint8_t* local;  // source (push) or destination (pull)
  uint64_t min_version = 0;
  uint64_t min_step = 0;
  // The tensor the chunk belongs to. A tensor's chunks on one shard travel
  // in one push-done, so that they are applied together.
  const TensorEntry* tensor = nullptr;
  bool on_gpu = false;  // `local` is GPU memory
  // push_pull: where the chunk's weights go after the push.
  uint8_t* out = nullptr;
  bool out_on_gpu = false;
};
using ChunkIos = std::vector<ChunkIo, PoolAllocator<ChunkIo>>;
using ByShard = std::vector<ChunkIos, PoolAllocator<ChunkIos>>;

// How one shard's part of a pull or push_pull ended: held in place, as the
// reply handlers that carry it.
using PartDone = InlineFunction<void(Status), 32>;

// A push's step, and whether this part counts it (wire::Push::step_parts;
// only the first message of the part carries it).
struct PushStep {
  uint64_t step = 0;
  uint32_t parts = 0;
};
// Hears how a push to one shard ended, and the versions it produced.
using PushDone = InlineFunction<void(Status, std::span<const uint64_t>), 64>;

}  // namespace tessera::client
