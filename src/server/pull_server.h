// A shard's pulls: granted at once when the version or step asked for is
// there (inline bytes for small ones, else a lease on the chunks the worker
// then reads one-sided), held until then or until their wait_ms runs out;
// the leases, their release and their revoke. Writers have priority: a
// chunk with an update waiting for its readers takes no new ones
// (Param::writer_waiting, set by the push applier). Progress thread only.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "core/spares.h"
#include "server/apply.h"
#include "server/lease_table.h"
#include "server/param_table.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "server/pull_waits.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::server {

class PullServer {
 public:
  // What the shard lends it; each outlives it.
  struct Lent {
    transport::Context* ctx = nullptr;
    PeerSessions* sessions = nullptr;
    ParamTable* table = nullptr;  // readers are counted in its chunks
    apply::Target target;         // where values are read from
    std::chrono::milliseconds lease_timeout{};
    // A lease ended: the updates waiting for its chunks' readers may apply.
    std::function<void()> readers_left;
  };
  PullServer(Lent lent, const WorkerRoster& roster, const ClusterSpec& cluster)
      : lent_(std::move(lent)), waits_(*lent_.table, roster, cluster) {}
  PullServer(const PullServer&) = delete;
  PullServer& operator=(const PullServer&) = delete;

  // The lease revoke timer.
  void Begin();
  // NotFound naming the first key the table does not hold.
  Status CheckKeys(const wire::Pull& msg) const;
  // A pull of chunks the table holds: answered now, or held.
  void Serve(Peer& peer, uint64_t request_id, wire::Pull msg);
  // The pull half of a push_pull: the weights the push produced (versions,
  // one per entry), inline, now or once its chunks' writers are done.
  void ServeWeights(Peer& peer, uint64_t request_id, const wire::Push& push,
                    const std::vector<uint64_t>& versions);
  // Answers the held pulls that can be answered now, and fails those waiting
  // for a sync step that can no longer complete.
  void GrantWaiting();
  // A lease's release; whether it ended one (readers left).
  bool Release(const Peer& peer, const wire::Release& msg);
  // A peer's end: its leases and held pulls go; whether a lease ended.
  bool PeerGone(const Peer& peer);
  // Pull messages handed back after use, for the next decode.
  Spares<wire::Pull>& spares() { return spares_; }
  // Why held pulls wait, and the workers' names.
  const PullWaits& waits() const { return waits_; }
  void Stop();
  void AddStats(ServerStats* stats) const;

 private:
  struct Held {
    Peer* peer;
    uint64_t request_id;
    wire::Pull msg;
    // When its wait_ms runs out (none: no limit of its own).
    std::optional<std::chrono::steady_clock::time_point> deadline;
  };

  // Answers `pull` if it can be now (granted, or failed with its chunk).
  bool TryGrant(Held& pull);
  // The bytes in the reply: one round trip, no lease.
  void ReplyInline(Held& pull, uint64_t total);
  // A lease on its chunks, which the worker reads one-sided.
  void ReplyWithLease(Held& pull);
  // Answers the held pulls whose wait_ms ran out, saying what each waits
  // for, and schedules the next sweep while any has a deadline. One timer at
  // a time, whatever the peers ask: a timer per pull would outlive it, for
  // as long as the peer's wait_ms says.
  void SweepExpired();
  void ScheduleSweep();
  void RevokeExpiredLeases();
  // A lease ended: its chunks have one reader fewer.
  void EndLease(const LeaseTable::Lease& lease);

  const Lent lent_;
  const PullWaits waits_;
  LeaseTable leases_;
  // A vector, not a deque: a deque frees and allocates a block as its
  // elements pass through it; this keeps its storage.
  std::vector<Held> held_;
  bool sweep_scheduled_ = false;
  bool stopping_ = false;
  // Kept across calls so that a reply reuses its vectors (core/borrowed.h).
  wire::PullReply reply_;
  // A pull hands its message back here once it is served, at once or after
  // waiting, and the next one is decoded into one of these: their vectors
  // keep their capacity.
  Spares<wire::Pull> spares_;
  std::atomic<uint64_t> served_{0}, leases_revoked_{0};
};

}  // namespace tessera::server
