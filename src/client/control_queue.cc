#include "client/control_queue.h"

namespace tessera::client {
namespace {

// Control calls end by themselves (each round trip has its own timeout, a
// wait for init the one it was given), so their futures wait for them; this
// only keeps the condition variable's deadline representable.
constexpr std::chrono::milliseconds kControlWaitBound = std::chrono::hours(24 * 365);

}  // namespace

ControlQueue::~ControlQueue() {
  Shutdown(Status::Aborted("the client was destroyed before this call started"));
  Join();
}

Future ControlQueue::Submit(std::function<Status()> job) {
  auto op = std::make_shared<Future::State>();
  op->timeout = kControlWaitBound;
  op->Add(1);  // held until the job ran, or was cancelled or failed
  op->start = Future::State::Start::kPending;
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_.ok()) {
      jobs_.push_back({op, std::move(job)});
      if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
      cv_.notify_one();
      return Future(op);
    }
    refused = shut_down_;
  }
  if (op->TryStart()) op->Finish(refused);
  return Future(op);
}

void ControlQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return !jobs_.empty() || !shut_down_.ok(); });
    if (jobs_.empty()) return;  // shut down, nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    if (job.op->TryStart()) job.op->Finish(job.run());  // else cancelled while queued
    job = {};  // the job's captures go before the next one starts
    lock.lock();
  }
}

void ControlQueue::Shutdown(const Status& why) {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shut_down_.ok()) return;
    shut_down_ = why;
    dropped.swap(jobs_);
    cv_.notify_all();
  }
  for (auto& job : dropped) {
    if (job.op->TryStart()) job.op->Finish(why);
  }
}

void ControlQueue::Join() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera::client
