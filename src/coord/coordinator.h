// The coordinator's state, embedded in shard 0: where every tensor lives
// (decided once, so workers agree whatever order they declare in) and whether
// the chief has initialised the parameters.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/placement.h"
#include "tessera/cluster.h"
#include "wire/messages.h"

namespace tessera::coord {

// What one cluster may declare. A declare is an authenticated worker's
// request, but its sizes are still the peer's word: these bound the records
// the coordinator builds for it, so no declare can exhaust its memory.
struct DeclareLimits {
  uint64_t max_chunks_per_tensor = 1u << 16;
  uint64_t max_tensors = 1u << 18;
  uint64_t max_chunks = 1u << 21;
  uint64_t max_tensor_bytes = uint64_t{1} << 44;  // 16 TiB
};

class Coordinator {
 public:
  struct Placed {
    wire::TensorDecl decl;
    std::string declared_by;
    std::vector<wire::ChunkPlacement> chunks;
    bool chief_declared = false;  // the chief's Initialize covers it
    bool initialized = false;     // the chief initialised it
  };

  explicit Coordinator(int num_shards, DeclareLimits limits = {})
      : num_shards_(num_shards), limits_(limits) {}

  // The cluster resumes from this checkpoint: its global step, and declares
  // learn which tensors the shards restore (same name, dtype and shape).
  void RestoreFrom(const ckpt::Checkpoint* checkpoint);
  const ckpt::Checkpoint* restored() const { return restored_; }

  // Places new tensors and returns every tensor's chunks; `who` names the
  // declaring task in errors. All-or-nothing.
  Result<wire::DeclareReply> Declare(const wire::Declare& msg, const std::string& who,
                                     bool by_chief);

  // The global step (TensorFlow's global_step): sync steps count once
  // replicas_to_aggregate workers (of the first sync tensor declared) have
  // finished them; async pushes count one each.
  void OnStepDone(uint32_t worker_rank, uint64_t step, bool sync);
  uint64_t global_step() const { return global_step_; }

  // The chief's init-done: what it declared so far is initialised.
  void MarkInitialized();
  bool initialized() const { return initialized_; }
  int num_shards() const { return num_shards_; }
  const std::map<std::string, Placed>& tensors() const { return tensors_; }

 private:
  // Refuses a new tensor that breaks a limit, naming it.
  Status CheckLimits(const wire::TensorDecl& t, uint64_t chunk_bytes, uint64_t* new_tensors,
                     uint64_t* new_chunks) const;

  int num_shards_;
  DeclareLimits limits_;
  uint64_t num_chunks_ = 0;
  std::unique_ptr<Placer> placer_;  // made on the first declare (its policy wins)
  std::map<std::string, Placed> tensors_;
  const ckpt::Checkpoint* restored_ = nullptr;
  bool initialized_ = false;
  uint64_t global_step_ = 0;
  uint32_t replicas_to_aggregate_ = 0;                   // from the first sync tensor
  std::map<uint64_t, std::set<uint32_t>> step_reports_;  // step -> workers done
};

}  // namespace tessera::coord
