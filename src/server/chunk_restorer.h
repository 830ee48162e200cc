// A checkpoint being restored into a shard: each chunk created while it is
// open loads its value and optimizer state from it, as the workers create
// them. A tensor the checkpoint does not hold, or holds with another dtype
// or shape, is left for the chief to initialise; one saved with another
// rule keeps its value and starts its optimizer state afresh. Progress
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "server/apply.h"
#include "server/param_table.h"

namespace tessera::server {

class ChunkRestorer {
 public:
  // The checkpoint at `path` (its manifest checked with `options.key`);
  // sync chunks resume at `step`.
  static Result<std::unique_ptr<ChunkRestorer>> Open(const std::string& path, uint64_t step,
                                                     const ckpt::OpenOptions& options);

  // Loads `p` (created, not yet initialised) into `target`'s memory;
  // whether it was restored.
  bool Restore(Param& p, const apply::Target& target);
  const std::string& path() const { return checkpoint_.path; }

 private:
  ChunkRestorer(ckpt::Checkpoint checkpoint, uint64_t step)
      : checkpoint_(std::move(checkpoint)), step_(step) {}
  // Its value and state slots, read into the shard's memory.
  Status ReadSlots(Param& p, const ckpt::TensorRecord& rec, const apply::Target& target);
  // Restored: versions, updates and where a sync chunk resumes.
  void Resumed(Param& p, const ckpt::TensorRecord& rec, const apply::Target& target);

  ckpt::Checkpoint checkpoint_;
  const uint64_t step_;  // the step restored sync chunks resume at
};

}  // namespace tessera::server
