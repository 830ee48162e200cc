// Bounds how often one kind of log line is written: at most `burst` lines in
// any `window`; the rest are counted, and the next line written says how
// many were held back. For lines a stranger can cause at will (every
// connection it opens and breaks), which must not flood the log.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tessera {

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;

  LogThrottle(size_t burst, std::chrono::milliseconds window) : burst_(burst), window_(window) {}

  // Whether to write the line now. When it returns true, `*held_back` is how
  // many lines it refused since the last one it allowed.
  bool Allow(Clock::time_point now, uint64_t* held_back) {
    if (now - window_start_ >= window_) {
      window_start_ = now;
      written_ = 0;
    }
    if (written_ >= burst_) {
      ++held_back_;
      return false;
    }
    ++written_;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  size_t burst_;
  std::chrono::milliseconds window_;
  Clock::time_point window_start_{};
  size_t written_ = 0;
  uint64_t held_back_ = 0;
};

}  // namespace tessera
