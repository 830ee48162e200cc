// The tables a shard holds: the dense tensors' (always, first) and, from
// issue 45, embedding tables. The shard's questions about all of them
// (steps, prepares, memory) are asked here once; each table's own units
// reach their table through its concrete class (table.h). Progress thread
// only.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "server/param_table.h"
#include "server/table.h"

namespace tessera::server {

class Tables {
 public:
  explicit Tables(std::unique_ptr<ParamTable> dense) : dense_(dense.get()) {
    tables_.push_back(std::move(dense));
  }

  ParamTable& dense() { return *dense_; }
  const ParamTable& dense() const { return *dense_; }

  // The furthest step any table's initialised sync entries reached.
  uint64_t SyncStepReached() const {
    uint64_t step = 0;
    for (const auto& t : tables_) step = std::max(step, t->SyncStepReached());
    return step;
  }
  // A checkpoint round's prepare, over every table.
  void ReportForPrepare(wire::CkptPrepared* reply) const {
    for (const auto& t : tables_) t->ReportForPrepare(reply);
  }
  uint64_t held_bytes() const {
    uint64_t bytes = 0;
    for (const auto& t : tables_) bytes += t->held_bytes();
    return bytes;
  }

 private:
  std::vector<std::unique_ptr<Table>> tables_;  // the dense one first
  ParamTable* const dense_;
};

}  // namespace tessera::server
