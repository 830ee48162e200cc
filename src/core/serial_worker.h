// Runs jobs in the order they were given on one thread of its own, started
// by the first job: file work (writing or removing a checkpoint) off a
// thread that must not block. Destroying it runs what is still queued, then
// joins the thread. Any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tessera {

class SerialWorker {
 public:
  SerialWorker() = default;
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;
  ~SerialWorker();

  void Run(std::function<void()> job);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace tessera
