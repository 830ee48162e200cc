// Whether a job's workers are done with this task: for a server started by
// an engine (tessera run), which must end when its workers have, since the
// engine waits for every task to end and nobody else stops the ps tasks.
//
// Done, OK: every worker of the cluster connected, and every one has left
// saying bye. Done with an error naming them: every worker that connected
// has left and some were lost (left without bye), or none is connected and
// some never came within the grace time since the last one left, or since
// the start when none ever came (their tasks died before connecting, or
// were never started). A worker that comes back in time (a restarted task)
// is no loss. Pure logic, fed by the shard.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "tessera/status.h"

namespace tessera::server {

class WorkerPresence {
 public:
  using Clock = std::chrono::steady_clock;
  WorkerPresence(int num_workers, std::chrono::milliseconds grace, Clock::time_point start)
      : num_workers_(num_workers), grace_(grace), none_since_(start) {}

  void Connected(uint32_t rank, const std::string& task);
  // One of the rank's connections ended; `said_bye`: it left on purpose.
  void Left(uint32_t rank, bool said_bye, Clock::time_point now);

  // The verdict, once there is one; `now` decides whether the grace time
  // for workers that never came has passed.
  std::optional<Status> Verdict(Clock::time_point now) const;
  // When to ask again for a verdict the grace time may bring.
  std::optional<Clock::time_point> NextCheck() const;

 private:
  struct Rank {
    std::string task;
    int connections = 0;
    bool lost = false;  // its last connection ended without a bye
  };
  int num_workers_;
  std::chrono::milliseconds grace_;
  std::map<uint32_t, Rank> seen_;
  int connected_ = 0;  // connections of all ranks
  std::optional<Clock::time_point> none_since_;
};

}  // namespace tessera::server
