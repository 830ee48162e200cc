// What became of the coordinator's checkpoint rounds: how many were written,
// how many failed, and what the last failure said. Counted on the progress
// thread, read from any (ServerStats, `tessera status`).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace tessera::coord {

class RoundTally {
 public:
  void Written() { written_.fetch_add(1, std::memory_order_relaxed); }
  void Failed(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    last_failure_ = std::move(why);
    failed_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  std::string last_failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_failure_;
  }

 private:
  std::atomic<uint64_t> written_{0}, failed_{0};
  mutable std::mutex mu_;
  std::string last_failure_;  // what the last abandoned round said
};

}  // namespace tessera::coord
