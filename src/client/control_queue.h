// The client's control calls (declare, initialise, wait for init), run one
// at a time in the order they were made, on a thread of their own.
//
// Each is a few round trips to the coordinator and the shards, made with
// blocking waits that ride out a coordinator's restart (CallCoordinator).
// Running them here keeps the progress thread free for pushes and pulls and
// makes their asynchronous forms a matter of queueing: DeclareAsync followed
// by InitializeAsync initialises what was declared, and a blocking Declare
// goes through the same queue, so it is ordered with them too. A call still
// queued may be cancelled (Future::Cancel).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "client/future_state.h"

namespace tessera::client {

class ControlQueue {
 public:
  ControlQueue() = default;
  ~ControlQueue();
  ControlQueue(const ControlQueue&) = delete;
  ControlQueue& operator=(const ControlQueue&) = delete;

  // Runs `job` after the calls submitted before it; its status finishes
  // the returned Future (whose Wait waits for it: each step of a job is
  // bounded by the client's own timeouts). After Shutdown, fails at once.
  Future Submit(std::function<Status()> job);

  // Fails the calls still queued with `why` and takes no more; the running
  // one (if any) goes on until its own calls fail or finish.
  void Shutdown(const Status& why);
  // Waits for the running call to end (after Shutdown).
  void Join();

 private:
  struct Job {
    std::shared_ptr<Future::State> op;
    std::function<Status()> run;
  };
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  Status shut_down_;    // non-OK once Shutdown was called
  std::thread thread_;  // started by the first Submit
};

}  // namespace tessera::client
