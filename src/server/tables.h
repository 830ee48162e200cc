// The tables a shard holds: the dense tensors' (always) and, from issue 45,
// embedding tables. Requests reach the table that serves their opcode (one
// lookup, one virtual call per message); the shard's questions about all of
// them (steps, joins, prepares, cuts, memory) are asked here once.
// Progress thread only, but AddStats and held_bytes.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "server/table.h"

namespace tessera::server {

class Tables {
 public:
  // A table, serving its opcodes: one another table serves already is a
  // mistake of the code, reported when the shard opens.
  Status Add(std::unique_ptr<Table> table);
  // The table serving `op`, or null.
  Table* For(wire::Opcode op) const {
    const auto i = static_cast<size_t>(op);
    return i < by_opcode_.size() ? by_opcode_[i] : nullptr;
  }

  void Ready(const wire::JoinReply& reply) {
    Each([&](Table& t) { t.Ready(reply); });
  }
  void RetryWaiting() {
    Each([](Table& t) { t.RetryWaiting(); });
  }
  void OnPeerGone(const Peer& peer) {
    Each([&](Table& t) { t.OnPeerGone(peer); });
  }
  void Begin() {
    Each([](Table& t) { t.Begin(); });
  }
  void Stop() {
    Each([](Table& t) { t.Stop(); });
  }
  void Release() {
    Each([](Table& t) { t.Release(); });
  }
  void AddStats(ServerStats* stats) const {
    for (const auto& t : tables_) t->AddStats(stats);
  }
  // The furthest step any table's initialised sync entries reached.
  uint64_t SyncStepReached() const {
    uint64_t step = 0;
    for (const auto& t : tables_) step = std::max(step, t->SyncStepReached());
    return step;
  }
  void AddToJoin(std::vector<wire::Join>* joins) const {
    for (const auto& t : tables_) t->AddToJoin(joins);
  }
  void ReportForPrepare(wire::CkptPrepared* reply) const {
    for (const auto& t : tables_) t->ReportForPrepare(reply);
  }
  // A round's write over every table: how many still copy entries later, or
  // why the round cannot be cut here (every table's cut dropped then).
  Result<size_t> BeginCut(CutRound* round);
  void DropCut() {
    Each([](Table& t) { t.DropCut(); });
  }
  uint64_t held_bytes() const {
    uint64_t bytes = 0;
    for (const auto& t : tables_) bytes += t->held_bytes();
    return bytes;
  }

 private:
  template <typename Fn>
  void Each(Fn fn) {
    for (auto& t : tables_) fn(*t);
  }

  std::vector<std::unique_ptr<Table>> tables_;
  std::array<Table*, wire::kMaxOpcode + 1> by_opcode_{};
};

}  // namespace tessera::server
