// What a shard asks of every table it holds, whatever its entries are: the
// dense tensors' chunks (DenseTable) today, the embedding tables of issue 45
// next. The shard hands a table each request of the opcodes it serves, one
// call per message: a table's entries are read and written by its own units
// (for the dense chunks: PushApplier, PullServer, ChunkCreator, DenseCut)
// through its concrete classes, so that no entry of a push or pull pays a
// virtual call. Checkpoint rounds and the coordinator's join go through here
// too. Progress thread only, but AddStats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "server/cut_round.h"
#include "server/peer.h"
#include "tessera/server.h"
#include "tessera/status.h"
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

  // Requests. The opcodes whose requests it serves (each opcode one table's).
  virtual std::vector<wire::Opcode> Opcodes() const = 0;
  // An authenticated peer's request of one of them.
  virtual void OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) = 0;
  // The coordinator's first answer: what to restore; creates wait for it.
  virtual void Ready(const wire::JoinReply& reply) = 0;
  // Updates and pulls that waited (a lease or a round ended, a worker left).
  virtual void RetryWaiting() = 0;
  // A peer's connection ended: what it held or waited for goes.
  virtual void OnPeerGone(const Peer& peer) = 0;
  virtual void Begin() = 0;  // its timers
  virtual void Stop() = 0;   // serves no more
  // Frees its entries' memory once the progress thread stopped; its counters
  // stay for AddStats.
  virtual void Release() = 0;
  virtual void AddStats(ServerStats* stats) const = 0;

  // Steps and checkpoints. The furthest step its initialised sync entries
  // reached (0: none).
  virtual uint64_t SyncStepReached() const = 0;
  // What the coordinator's join learns of its entries (their declarations,
  // as set at run time, and whether initialised).
  virtual void AddToJoin(std::vector<wire::Join>* joins) const = 0;
  // A checkpoint round's prepare: its initialised entries counted into
  // `reply`, and the steps of its sync entries into its range.
  virtual void ReportForPrepare(wire::CkptPrepared* reply) const = 0;
  // A round's write, while updates are held: its entries laid out into
  // `round` and copied at the round's step; true when all were, false when
  // some are copied later (the table then tells its participant), or why
  // the round cannot be cut here.
  virtual Result<bool> BeginCut(CutRound* round) = 0;
  // The round ended (written, failed or abandoned): nothing more is copied.
  virtual void DropCut() = 0;
};

}  // namespace tessera::server
