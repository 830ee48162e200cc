#include "server/rows_pull_waits.h"

#include "core/log.h"

namespace tessera::server {

void RowsPullWaits::Hold(Peer& peer, uint64_t request_id, wire::RowsPull msg) {
  if (held_.size() >= kMaxHeld) {
    return lent_.sessions->SendError(
        peer, request_id,
        Status::ResourceExhausted("this ps task holds " + std::to_string(kMaxHeld) +
                                  " rows-pulls waiting for their step already"));
  }
  const uint64_t token = next_token_++;
  const uint32_t wait_ms = msg.wait_ms;
  held_.push_back({&peer, request_id, std::move(msg), token});
  // wait_ms 0: no limit of the shard's own (the worker's op timeout ends it).
  if (wait_ms == 0) return;
  lent_.ctx->PostAfter(std::chrono::milliseconds(wait_ms), [this, token] { Expire(token); });
}

void RowsPullWaits::Expire(uint64_t token) {
  if (stopping_) return;
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->token != token) continue;
    const std::string what = lent_.missing(it->msg.table_id, it->msg.min_step - 1);
    TLOG_WARN("{}'s rows-pull waited {} ms: {}", it->peer->hello.task, it->msg.wait_ms, what);
    lent_.sessions->SendError(
        *it->peer, it->request_id,
        Status::DeadlineExceeded("waited " + std::to_string(it->msg.wait_ms) + " ms: " + what));
    held_.erase(it);
    return;
  }
}

void RowsPullWaits::Forget(const Peer& peer) {
  held_.remove_if([&](const Waiting& w) { return w.peer == &peer; });
}

}  // namespace tessera::server
