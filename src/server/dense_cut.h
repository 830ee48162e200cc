// The dense table's part of a checkpoint round's cut: the round's entries
// checked against the chunks held and laid out, then each chunk's slots
// copied out of the shard's memory at the round's step. A sync chunk still
// short of that step is copied when it gets there (StepApplied), so the cut
// is consistent although updates resume meanwhile. Progress thread only.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "server/cut_round.h"
#include "server/param_memory.h"
#include "server/param_table.h"
#include "tessera/status.h"

namespace tessera::server {

class DenseCut {
 public:
  struct Events {
    std::function<void()> captured;             // every chunk the round names is
    std::function<void(const Status&)> failed;  // the round cannot be cut here
  };
  DenseCut(ParamTable& table, ParamMemory& memory, std::string task, Events events)
      : table_(table), memory_(memory), task_(std::move(task)), events_(std::move(events)) {}

  // Lays `round` out (it outlives the cut, or Drop comes first) and copies
  // the chunks at its step; whether all of them were, or why not.
  Result<bool> Begin(CutRound* round);
  // A sync chunk applied a step: copied if the round waits for it.
  void StepApplied(Param& p);
  // The round ended: nothing more is copied.
  void Drop();

 private:
  // The round's entries checked against the chunks held.
  Status Lay();
  // Copies the chunk's slots into the round.
  Status Capture(Param& p);

  ParamTable& table_;
  ParamMemory& memory_;
  const std::string task_;  // as errors name it ("/job:ps/task:1")
  const Events events_;
  CutRound* round_ = nullptr;                           // while cutting
  std::map<uint32_t, std::vector<size_t>> entries_of_;  // key id -> its entries
  std::set<uint32_t> behind_;                           // sync chunks still short of the step
  std::map<size_t, size_t> update_index_;               // entry -> index into updates
};

}  // namespace tessera::server
