// Judges a peer dead only after it has been silent for the whole timeout
// while this process was listening.
//
// A heartbeat check that compares "now" with the peer's last traffic takes
// its own stalls for the peer's silence: a progress loop held up for longer
// than the timeout (a large registration, slow emulation, a busy host) would
// find every peer "silent" at once, with their answers still unread in its
// queues. The meter counts only listening time instead: the time between two
// heartbeat ticks counts in full while the ticks come on time, and at most
// `max_gap` when a tick comes late (the loop was busy, not listening). The
// caller drains the fabric before each tick (EventLoop does before timers),
// so traffic that arrived during a stall is seen before judging.
#pragma once

#include <algorithm>
#include <chrono>

namespace tessera {

class SilenceMeter {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeout`: listening time without any traffic after which the peer is
  // dead. `max_gap`: the most one tick may count (about two heartbeat
  // intervals: a later tick means the loop was held up).
  SilenceMeter() = default;
  SilenceMeter(std::chrono::milliseconds timeout, std::chrono::milliseconds max_gap)
      : timeout_(timeout), max_gap_(max_gap) {}

  // Starts counting afresh (a new connection).
  void Reset(Clock::time_point now) {
    last_tick_ = now;
    silent_ = Clock::duration::zero();
  }

  // One heartbeat tick, with the time of the peer's last traffic. Returns
  // true once the peer has been silent for longer than the timeout.
  bool Tick(Clock::time_point now, Clock::time_point last_traffic) {
    const Clock::duration listened = std::min<Clock::duration>(now - last_tick_, max_gap_);
    if (last_traffic > last_tick_) {
      silent_ = std::min<Clock::duration>(now - last_traffic, listened);
    } else {
      silent_ += listened;
    }
    last_tick_ = now;
    return silent_ > timeout_;
  }

  // Listening time since the peer's last traffic, as of the last tick.
  std::chrono::milliseconds silent() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(silent_);
  }

 private:
  std::chrono::milliseconds timeout_{5'000};
  std::chrono::milliseconds max_gap_{2'000};
  Clock::time_point last_tick_{};
  Clock::duration silent_{};
};

}  // namespace tessera
