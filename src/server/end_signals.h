// How a server's end is waited for, from any thread: the verdict on its
// workers (ServerOptions::stop_when_workers_leave; a stop gives one too)
// and, off the coordinator, the coordinator's own stop. Set on the progress
// thread, waited for by whoever runs the server.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "tessera/status.h"

namespace tessera::server {

class EndSignals {
 public:
  // The first verdict holds; later ones are ignored.
  void Decide(const Status& verdict) {
    std::lock_guard<std::mutex> lock(mu_);
    if (verdict_) return;
    verdict_ = verdict;
    cv_.notify_all();
  }
  void NoteCoordinatorStopped() {
    std::lock_guard<std::mutex> lock(mu_);
    coordinator_stopped_ = true;
    cv_.notify_all();
  }
  // The verdict, if there was one within `limit`.
  std::optional<Status> WaitForVerdict(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, limit, [&] { return verdict_.has_value(); });
    return verdict_;
  }
  // Whether the coordinator stopped within `limit`.
  bool WaitForCoordinatorStop(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return coordinator_stopped_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> verdict_;
  bool coordinator_stopped_ = false;
};

}  // namespace tessera::server
