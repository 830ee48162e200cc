// The embedding tables' Table (issue 45): every embedding table's rows on
// this ps task, one RowStore each under the id the coordinator gave it.
// create-table makes a table (every worker sends it; the same declaration
// again is answered as the first), rows-pull reads rows (RowsPullServer),
// rows-push updates them (RowsPushApplier; a sync table's steps by
// SyncRowSteps, and pulls that wait for a step by RowsPullWaits). What is
// not served yet is refused by name: bounded tables at create; a checkpoint round
// while a table exists (a checkpoint without its rows would restore a
// model that lost them). Progress thread only, but AddStats.
#pragma once

#include <map>
#include <memory>

#include "core/row_placement.h"
#include "server/held_rows.h"
#include "server/peer_sessions.h"
#include "server/rows_pull_server.h"
#include "server/rows_pull_waits.h"
#include "server/rows_push_applier.h"
#include "server/table.h"
#include "tessera/server.h"

namespace tessera::server {

class RowTables final : public Table {
 public:
  struct Lent {
    const ServerOptions* options = nullptr;
    transport::Context* ctx = nullptr;
    PeerSessions* sessions = nullptr;
  };
  explicit RowTables(Lent lent);
  RowTables(const RowTables&) = delete;
  RowTables& operator=(const RowTables&) = delete;

  std::string_view kind() const override { return "embedding"; }
  size_t entries() const override;       // rows, over every table
  uint64_t held_bytes() const override;  // what their rows and indexes map

  std::vector<wire::Opcode> Opcodes() const override;
  void OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) override;
  void Ready(const wire::JoinReply&) override {}
  void RetryWaiting() override {}
  void OnPeerGone(const Peer& peer) override { waits_.Forget(peer); }
  void Begin() override {}
  void Stop() override { waits_.Stop(); }
  void Release() override { tables_.clear(); }
  void AddStats(ServerStats*) const override {}

  uint64_t SyncStepReached() const override;
  void AddToJoin(std::vector<wire::Join>*) const override {}
  void ReportForPrepare(wire::CkptPrepared*) const override {}
  Result<bool> BeginCut(CutRound* round) override;
  void DropCut() override {}

 private:
  void OnCreate(Peer& peer, uint64_t request_id, const wire::CreateTable& msg);
  void OnPull(Peer& peer, uint64_t request_id, HeldRows& table, const wire::RowsPull& msg);
  // A table made from its declaration, or why not.
  Result<HeldRows> Make(const wire::CreateTable& msg) const;
  // The table a request names, or null after the peer was told why not.
  HeldRows* Find(Peer& peer, uint64_t request_id, uint32_t table_id);
  void Refuse(Peer& peer, const wire::Header& h, const Status& why);

  const Lent lent_;
  const RowPlacement placement_;
  std::map<uint32_t, HeldRows> tables_;
  RowsPullServer pulls_;
  RowsPullWaits waits_;
  RowsPushApplier pushes_;
};

}  // namespace tessera::server
