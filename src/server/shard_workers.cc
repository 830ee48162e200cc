// A shard's side of its workers (the server's PeerSessions admit and
// authenticate them): their slots, what a peer's end leaves behind, and the
// recheck once a departed worker's rejoin grace ran out.

#include "server/shard.h"

namespace tessera::server {

Status Shard::OnWorkerJoins(Peer& peer, wire::Welcome* welcome) {
  return memory_->GiveWorkerSlots(peer, welcome);
}

void Shard::OnPeerGone(const Peer& peer, bool rank_departed) {
  if (rank_departed) RecheckAfterRejoinGrace();
  tables_.OnPeerGone(peer);
  RetryWaiting();
}

void Shard::RecheckAfterRejoinGrace() {
  if (stopping_ || rejoin_recheck_scheduled_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto earliest = lent_.roster->NextRejoinDeadline(now);
  if (!earliest) return;
  rejoin_recheck_scheduled_ = true;
  ctx_->PostAfter(std::chrono::duration_cast<std::chrono::milliseconds>(*earliest - now) +
                      std::chrono::milliseconds(1),
                  [this] {
                    rejoin_recheck_scheduled_ = false;
                    if (stopping_) return;
                    RetryWaiting();
                    RecheckAfterRejoinGrace();  // the next departure still awaited
                  });
}

}  // namespace tessera::server
