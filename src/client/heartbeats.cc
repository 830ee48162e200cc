// Heartbeats: pings, silent shards declared lost, lost ones tried again.

#include "client/heartbeats.h"

#include "core/log.h"

namespace tessera::client {

void Heartbeats::Start() {
  ctx_.Post([this] {
    for (size_t i = 0; i < links_.size(); ++i) {
      links_[static_cast<int>(i)].silence.Reset(std::chrono::steady_clock::now());
    }
    ctx_.PostAfter(interval_, [this] { Beat(); });
  });
}

void Heartbeats::Beat() {
  if (links_.stopping()) return;
  // The event loop polled the fabric until idle before running this timer,
  // so whatever the shards sent meanwhile has been seen.
  const auto now = std::chrono::steady_clock::now();
  const auto late = now - next_beat_;
  if (next_beat_.time_since_epoch().count() != 0 && late > timeout_) {
    // Worth knowing (it explains slow calls), and not held against the
    // shards: the silence meters count at most two intervals for it.
    TLOG_WARN("{}: this worker's progress loop was held up for {} ms; heartbeats resume", task_,
              std::chrono::duration_cast<std::chrono::milliseconds>(late).count());
  }
  next_beat_ = now + interval_;
  for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
    ShardLink& s = links_[i];
    if (!s.dead.ok()) {
      links_.Reconnect(i);
      continue;
    }
    if (!s.ep) continue;
    if (s.silence.Tick(now, s.ep->last_traffic())) {
      links_.Lost(i, Status::DeadlineExceeded("no answer to heartbeats and no traffic at all for " +
                                              std::to_string(s.silence.silent().count()) +
                                              " ms of listening (heartbeat timeout " +
                                              std::to_string(timeout_.count()) + " ms)"));
      continue;
    }
    links_.Request(i, wire::Ping{}, 0,
                   [](const Status&, const wire::Header&, std::span<const uint8_t>) {});
  }
  ctx_.PostAfter(interval_, [this] { Beat(); });
}

}  // namespace tessera::client
