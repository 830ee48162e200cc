#include "core/serial_worker.h"

namespace tessera {

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;  // what is queued still runs
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SerialWorker::Run(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(job));
  cv_.notify_one();
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void SerialWorker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return done_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // done, and nothing left to run
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace tessera
