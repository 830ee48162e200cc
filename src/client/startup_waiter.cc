#include "client/startup_waiter.h"

#include <optional>

#include "core/log.h"

namespace tessera::client {

StartupWaiter::StartupWaiter(std::vector<std::string> names)
    : names_(std::move(names)),
      state_(names_.size(), State::kConnecting),
      error_(names_.size(), kNoAnswerYet) {}

void StartupWaiter::Retrying(size_t i, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_[i] = why;
  }
  cv_.notify_all();  // Wait says so at once
}

void StartupWaiter::Failed(size_t i, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_[i] = State::kFailed;
    error_[i] = why.message();
    code_ = why.code();
  }
  cv_.notify_all();
}

void StartupWaiter::Welcomed(size_t i) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_[i] = State::kWelcomed;
  }
  cv_.notify_all();
}

StartupWaiter::Lists StartupWaiter::Summarize() const {
  Lists lists;
  auto add = [](std::string& list, const std::string& line) {
    list += (list.empty() ? "" : "; ") + line;
  };
  for (size_t i = 0; i < names_.size(); ++i) {
    if (state_[i] == State::kWelcomed) continue;
    const std::string line = names_[i] + ": " + error_[i];
    add(state_[i] == State::kFailed ? lists.failed : lists.missing, line);
    if (state_[i] == State::kConnecting && error_[i] != kNoAnswerYet) add(lists.refused, line);
  }
  return lists;
}

Status StartupWaiter::Wait(const Options& o) {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<Clock::time_point> next_report;
  while (true) {
    const Lists lists = Summarize();
    if (lists.missing.empty() && lists.failed.empty()) return Status::Ok();
    if (!lists.failed.empty()) return Status(code_, "cannot join the cluster: " + lists.failed);
    const auto now = Clock::now();
    if (now >= o.deadline) {
      return Status::DeadlineExceeded("ps tasks not reachable within " +
                                      std::to_string(o.startup_timeout.count()) +
                                      " ms: " + lists.missing);
    }
    if (!lists.refused.empty() && (!next_report || now >= *next_report)) {
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(o.deadline - now);
      TLOG_INFO("{} waiting up to {} s more for ps tasks (they may start in any order): {}", o.task,
                left.count(), lists.refused);
      next_report =
          o.report_interval.count() > 0 ? now + o.report_interval : Clock::time_point::max();
    }
    auto until = std::min(o.deadline, next_report.value_or(o.deadline));
    if (o.interrupted) {
      lock.unlock();
      const bool stop = o.interrupted();
      lock.lock();
      if (stop) {
        return Status::Cancelled("interrupted while waiting for ps tasks: " + lists.missing);
      }
      until = std::min(until, now + std::chrono::milliseconds(20));
    }
    cv_.wait_until(lock, until);
  }
}

}  // namespace tessera::client
