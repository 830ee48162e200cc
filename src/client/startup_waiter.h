// What a client's start waits for: a connection welcomed by each ps task
// (and the coordinator, where it runs apart). Tasks start in any order, so a
// task with nothing listening yet is waited for, and the wait says for whom
// as it goes; it ends when all were welcomed, at once when one refused this
// client for good, at the deadline, or when the caller is interrupted. The
// loop thread reports each task's attempts; the starting thread waits.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/status.h"

namespace tessera::client {

class StartupWaiter {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::string task;  // this client's, for the log
    Clock::time_point deadline;
    std::chrono::milliseconds startup_timeout{};  // what the deadline came from
    // How often to say whom it still waits for (0: once).
    std::chrono::milliseconds report_interval{};
    // Whether the caller gave up (Ctrl-C); asked at least every 20 ms.
    std::function<bool()> interrupted;
  };

  // Before the first attempt: the tasks, by name.
  explicit StartupWaiter(std::vector<std::string> names);

  // Loop thread: task `i`'s attempt failed and is tried again, or failed
  // for good, or it welcomed this client.
  void Retrying(size_t i, const std::string& why);
  void Failed(size_t i, const Status& why);
  void Welcomed(size_t i);

  // The starting thread: OK once every task welcomed this client, else why
  // not, naming each task still missing with its last error.
  Status Wait(const Options& options);

 private:
  enum class State { kConnecting, kWelcomed, kFailed };
  struct Lists {
    std::string missing, failed;
    std::string refused;  // those an attempt failed for
  };
  static constexpr const char* kNoAnswerYet = "no answer yet";
  Lists Summarize() const;  // mu_ held

  const std::vector<std::string> names_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;
  std::vector<std::string> error_;  // the last attempt's, or kNoAnswerYet
  StatusCode code_ = StatusCode::kUnavailable;
};

}  // namespace tessera::client
