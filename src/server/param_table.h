// The parameters a shard holds: each chunk of each tensor at an offset in one
// of a few large arenas the fabric allocated (remotely readable, never
// remotely writable), in the shard's memory (host or GPU). Where the fabric
// cannot reach GPU memory and the user allowed host staging, the arenas are
// host memory holding a published copy of each GPU-resident chunk. The
// entries of the dense table (dense_table.h), whose units use this class
// directly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/update.h"
#include "server/param_memory.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::server {

// A chunk the shard holds: plain data laid out for the hot path (so it keeps
// more fields than a class would; tools/code_shape.py reads this comment).
// Its first cache line holds all that a push or pull of a host chunk reads or
// sets (a batch of small tensors is mostly these loads, one chunk after
// another); the declaration and the rest follow.
struct alignas(64) Param {
  uint32_t key_id = 0;
  uint32_t readers = 0;  // pull leases that may be reading the bytes now
  uint64_t bytes = 0;
  // Where the update kernels work on the value (the shard's memory), and
  // what workers read one-sided (the arena). The same bytes, except with host
  // staging: then `published` is a host copy refreshed after every change.
  uint8_t* data = nullptr;
  uint8_t* published = nullptr;
  uint64_t version = 0;  // bumped by every applied update; 1 after init
  // Sync: the step being aggregated (= steps applied).
  uint64_t step = 0;
  // entry.elem_count and entry.tensor's dtype, rule and mode kind, set with
  // `entry` (SetEntry) and never changed after.
  uint64_t elem_count = 0;
  DType dtype = DType::kF32;
  UpdateRule rule = UpdateRule::kAssign;
  Consistency kind = Consistency::kAsync;
  bool initialized = false;
  bool writer_waiting = false;  // an update waits for readers: new pulls wait too
  // Sync, restored from a checkpoint: the step it resumes at is the
  // coordinator's estimate, one step short of the furthest chunk's when the
  // coordinator restarted too; the first push may move it forward.
  bool resume_at_first_push = false;
  // Sync, restored: no step applied since. A worker whose push of this step
  // reached the shard before its restart (and was lost with it) pulls the
  // next step without pushing again (Shard::ResumeForPull).
  bool resuming = false;
  bool failed = false;  // !failure().ok(), kept here for the hot line

  wire::CreateEntry entry;  // tensor declaration and which chunk this is
  void SetEntry(const wire::CreateEntry& e) {
    entry = e;
    elem_count = e.elem_count;
    dtype = e.tensor.dtype;
    rule = e.tensor.rule;
    kind = e.tensor.mode.kind;
  }
  // Sync: a step whose update failed. Its pushers were told OK when their
  // gradients were counted, so every later push and pull of the chunk gets
  // this error instead, until an initialising push sets a value afresh.
  const Status& failure() const { return failure_; }
  void SetFailure(Status st) {
    failed = !st.ok();
    failure_ = std::move(st);
  }
  std::string display_name;  // "w" or "w (chunk 2 of 5)"
  uint32_t arena_id = 0;
  uint64_t arena_offset = 0;

  // Optimizer state, in the shard's memory, never remotely accessible (see
  // kernels::RuleState).
  Hyperparams hyper;
  StateBuffer state0, state1;
  StateBuffer master;    // f32
  uint64_t updates = 0;  // optimizer steps applied since init (Adam's t)
  kernels::RuleState rule_state() {
    return {state0.empty() ? nullptr : state0.data(), state1.empty() ? nullptr : state1.data(),
            master.empty() ? nullptr : reinterpret_cast<float*>(master.data())};
  }

  // Sync: the running sum of `step` (f32 for f16/bf16 parameters, else the
  // parameter's dtype).
  StateBuffer agg;
  uint32_t agg_count = 0;
  std::vector<bool> contributed;  // by worker rank, this step
  // Bounded: steps each worker rank has pushed.
  std::vector<uint64_t> pushed_steps;
  void ResetAggregation() {
    agg_count = 0;
    std::fill(contributed.begin(), contributed.end(), false);
  }
  // Sync: steps applied; bounded: steps every worker pushed; async: updates.
  uint64_t StepReached() const {
    switch (kind) {
      case Consistency::kSync:
        return step;
      case Consistency::kBounded:
        return pushed_steps.empty() ? 0
                                    : *std::min_element(pushed_steps.begin(), pushed_steps.end());
      case Consistency::kAsync:
        break;
    }
    return version > 0 ? version - 1 : 0;
  }

 private:
  Status failure_;
};

class ParamTable {
 public:
  // Arenas are allocated of `arena_kind`: the memory's own kind, or host
  // memory for staging GPU-resident values.
  ParamTable(transport::Context* ctx, ParamMemory* memory, transport::MemoryKind arena_kind,
             size_t arena_bytes, int num_workers)
      : ctx_(ctx),
        memory_(memory),
        arena_kind_(arena_kind),
        arena_bytes_(arena_bytes),
        num_workers_(num_workers) {}

  // True when values live in GPU memory and workers read host copies.
  bool staged() const { return arena_kind_ != memory_->spec().kind; }

  // Creates the chunk, or returns the existing one if it matches; a mismatch
  // is an error naming both declarations.
  Result<Param*> Create(const wire::CreateEntry& entry);
  // The bytes a chunk takes: its value, optimizer state, f32 master copy,
  // a sync step's sum, and the host copy of a staged value.
  uint64_t FootprintOf(const wire::CreateEntry& entry) const;
  // Whether the chunks of `entries` not held yet fit: at most `max_chunks`
  // held, and at most `budget` bytes of them; otherwise ResourceExhausted
  // naming the first that does not.
  Status CheckRoom(const std::vector<wire::CreateEntry>& entries, uint64_t budget,
                   uint64_t max_chunks) const;
  // Frees the chunks and arenas, once nothing reads or writes them (the
  // progress thread stopped).
  void Release() {
    by_name_.clear();
    params_.clear();
    arenas_.clear();
  }
  // The bytes its chunks take (FootprintOf each).
  uint64_t held_bytes() const { return held_bytes_; }
  // The furthest step its initialised sync chunks reached (0: none).
  uint64_t SyncStepReached() const;
  // A checkpoint round's prepare: the initialised chunks counted into
  // `reply`, and the steps of the sync ones into its range.
  void ReportForPrepare(wire::CkptPrepared* reply) const;

  // Inline: every entry of every push and pull looks its key up.
  Param* Find(uint32_t key_id) { return key_id < params_.size() ? params_[key_id].get() : nullptr; }
  const Param* Find(uint32_t key_id) const {
    return key_id < params_.size() ? params_[key_id].get() : nullptr;
  }
  Param* Find(const std::string& name, uint32_t chunk_index);
  template <typename Fn>
  void ForEach(Fn fn) {
    for (auto& p : params_) fn(*p);
  }
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& p : params_) fn(static_cast<const Param&>(*p));
  }
  size_t size() const { return params_.size(); }
  size_t num_arenas() const { return arenas_.size(); }
  std::vector<uint8_t> DescribeArena(uint32_t arena_id) const {
    return arenas_[arena_id].region->Describe();
  }
  uint64_t arena_base(uint32_t arena_id) const {
    return reinterpret_cast<uint64_t>(arenas_[arena_id].region->data());
  }
  // A GPU arena's CUDA IPC handle (exported once), for workers on this node.
  Result<std::vector<uint8_t>> ArenaIpcHandle(uint32_t arena_id);

 private:
  struct Arena {
    // GPU memory: the allocation holding the values. Empty for host memory,
    // whose values are the region's bytes.
    StateBuffer values;
    // What the fabric reaches: the host arena, `values` registered, or (host
    // staging) a host copy of `values`.
    std::unique_ptr<transport::Region> region;
    std::vector<uint8_t> ipc_handle;  // exported on first request
    uint64_t used = 0;
  };
  Result<std::pair<uint32_t, uint64_t>> AllocateBytes(uint64_t bytes);

  transport::Context* ctx_;
  ParamMemory* memory_;
  transport::MemoryKind arena_kind_;
  size_t arena_bytes_;
  int num_workers_;
  std::vector<Arena> arenas_;
  std::vector<std::unique_ptr<Param>> params_;                    // index = key_id
  std::map<std::pair<std::string, uint32_t>, uint32_t> by_name_;  // (name, chunk) -> key_id
  uint64_t held_bytes_ = 0;                                       // FootprintOf every chunk
};

}  // namespace tessera::server
