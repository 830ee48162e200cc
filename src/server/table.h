// What a shard asks of every table it holds, whatever its entries are: the
// dense tensors' chunks (ParamTable) today, the embedding tables of issue 45
// next. Only questions about a whole table are here. A table's entries are
// read and written by the units of its kind (for the dense chunks:
// PushApplier, PullServer, ChunkCreator, ChunkRestorer, the checkpoint
// participant's cut) through the concrete class, so that no entry of a push
// or pull pays a virtual call. Progress thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "wire/messages.h"

namespace tessera::server {

class Table {
 public:
  virtual ~Table() = default;
  // What holds its entries, for logs and status ("dense").
  virtual std::string_view kind() const = 0;
  // Entries held (a dense table's chunks), and the bytes they take: values,
  // optimizer state, sync sums and host copies.
  virtual size_t entries() const = 0;
  virtual uint64_t held_bytes() const = 0;
  // The furthest step its initialised sync entries reached (0: none).
  virtual uint64_t SyncStepReached() const = 0;
  // A checkpoint round's prepare: its initialised entries counted into
  // `reply`, and the steps of its sync entries into its range.
  virtual void ReportForPrepare(wire::CkptPrepared* reply) const = 0;
};

}  // namespace tessera::server
