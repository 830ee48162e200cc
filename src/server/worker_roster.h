// Which worker ranks are connected, and since when a rank that left has
// had no connection: a sync step waits for a departed worker for
// `rejoin_grace` (a restarted task comes back), then is refused, naming it.
// Pure logic, fed by the server's sessions; progress thread only, but for
// departures().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace tessera::server {

class WorkerRoster {
 public:
  using Clock = std::chrono::steady_clock;
  explicit WorkerRoster(std::chrono::milliseconds rejoin_grace) : rejoin_grace_(rejoin_grace) {}

  // One more connection of the rank (a restarted worker is back).
  void Joined(uint32_t rank);
  // One of the rank's connections ended; whether it was its last.
  bool Left(uint32_t rank, const std::string& task, Clock::time_point now);
  // Whether the rank may still push: connected, or gone for less than the
  // grace time. Else `gone` names its task.
  bool MayStillPush(uint32_t rank, Clock::time_point now, std::string* gone) const;
  // When the earliest departed rank stops being awaited, if one still is.
  std::optional<Clock::time_point> NextRejoinDeadline(Clock::time_point now) const;
  std::chrono::milliseconds rejoin_grace() const { return rejoin_grace_; }
  // Ranks that lost their last connection, so far (any thread).
  uint64_t departures() const { return departures_.load(std::memory_order_relaxed); }

 private:
  struct Departed {
    std::string task;
    Clock::time_point since;
  };
  const std::chrono::milliseconds rejoin_grace_;
  std::map<uint32_t, int> connections_;  // per rank
  std::map<uint32_t, Departed> departed_;
  std::atomic<uint64_t> departures_{0};
};

}  // namespace tessera::server
