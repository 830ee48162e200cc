#include "client/coordinator_reach.h"

namespace tessera::client {

void CoordinatorReach::Note(bool up) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    up_ = up;
    if (up) reached_++;
  }
  cv_.notify_all();
}

uint64_t CoordinatorReach::reached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reached_;
}

CoordinatorReach::Wait CoordinatorReach::WaitForReturn(uint64_t reached_before,
                                                       Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closing_) return Wait::kClosing;
  if (up_ && reached_ == reached_before) return Wait::kItSaidSo;
  const bool back =
      cv_.wait_until(lock, deadline, [&] { return reached_ != reached_before || closing_; });
  if (closing_) return Wait::kClosing;
  return back ? Wait::kBack : Wait::kTimedOut;
}

void CoordinatorReach::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
}

}  // namespace tessera::client
