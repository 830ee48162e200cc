// Whether a client reaches its coordinator, and how often it has: a call to
// the coordinator that failed because the coordinator was lost waits here
// for it to be reached again, then is sent once more
// (ShardLinks::CallCoordinator). The loop thread notes; any thread waits.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace tessera::client {

class CoordinatorReach {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Wait {
    kItSaidSo,  // it is reached and was not lost since: the call's error is its own
    kBack,      // reached again since: send the call again
    kTimedOut,  // not reached again by the deadline
    kClosing,   // the client is going: nobody waits any more
  };

  // Loop thread: the coordinator was lost, or reached (again).
  void Note(bool up);
  // How often it was reached so far.
  uint64_t reached() const;
  // After a call sent when reached() said `reached_before` failed as
  // unavailable: whether it was the coordinator's own answer, or else until
  // the coordinator is reached again, the deadline passes or Close.
  Wait WaitForReturn(uint64_t reached_before, Clock::time_point deadline);
  // The client is being destroyed: waiters return kClosing, now and later.
  void Close();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool up_ = false;
  uint64_t reached_ = 0;
  bool closing_ = false;
};

}  // namespace tessera::client
