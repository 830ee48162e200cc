// The state behind a Future, shared by the client's parts: parts of a call
// finish it, waiters drive the client's progress while they wait.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/client.h"
#include "transport/transport.h"

namespace tessera {

// Lets a thread that waits on a Future drive the client's progress itself,
// for as long as the client exists: the reply is then received on the
// waiting thread instead of being handed over by the progress thread.
class ProgressDriver {
 public:
  explicit ProgressDriver(transport::Context* ctx) : ctx_(ctx) {}

  // One turn of the client's progress engine, if no other thread is in it.
  bool Drive() {
    users_.fetch_add(1);
    const bool worked = !closed_.load() && ctx_->Drive();
    users_.fetch_sub(1);
    return worked;
  }
  void StopDriving() {
    users_.fetch_add(1);
    if (!closed_.load()) ctx_->StopDriving();
    users_.fetch_sub(1);
  }
  void PauseDriving() {
    users_.fetch_add(1);
    if (!closed_.load()) ctx_->PauseDriving();
    users_.fetch_sub(1);
  }
  // Called before the context goes: later Drive calls do nothing, and the
  // ones already inside it have left when this returns.
  void Close() {
    closed_.store(true);
    while (users_.load() != 0) std::this_thread::yield();
  }

 private:
  transport::Context* const ctx_;
  // Sequentially consistent, so that Close and Drive cannot miss each other.
  std::atomic<int> users_{0};
  std::atomic<bool> closed_{false};
};

// Posts onto the client's progress thread for as long as the client exists,
// from any thread: CUDA's host functions start stream-ordered calls through
// it, and may run after the client is gone.
class LoopPoster {
 public:
  explicit LoopPoster(transport::Context* ctx) : ctx_(ctx) {}
  // False once closed: `fn` is dropped.
  bool Post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_ == nullptr) return false;
    ctx_->Post(std::move(fn));
    return true;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = nullptr;
  }

 private:
  std::mutex mu_;
  transport::Context* ctx_;
};

struct Future::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // every part finished: the status is final
  // Done, and the continuations (Then) have run: only now do waiters go on,
  // so that what a continuation sends (the worker's step report) is on its
  // way before anything the waiter does next. Set under mu.
  std::atomic<bool> ready{false};
  Status status;
  int remaining = 0;  // parts still running
  std::vector<std::function<void(Status)>> then;
  std::vector<DroppedChunk> dropped;  // a push's, guarded by mu
  std::chrono::milliseconds timeout{60'000};
  std::shared_ptr<ProgressDriver> driver;  // null for futures failed at once

  // Whether the call has started. One that waits to (posted to the loop
  // thread, queued behind other control calls, or waiting for the work
  // before it on a CUDA stream) may be cancelled until then; whoever starts
  // it calls TryStart first. Futures made any other way start started.
  enum class Start : uint8_t { kPending, kStarted, kCancelled };
  std::atomic<Start> start{Start::kStarted};
  // False when the call was cancelled: it must not start.
  bool TryStart() {
    Start expect = Start::kPending;
    return start.compare_exchange_strong(expect, Start::kStarted) || expect == Start::kStarted;
  }
  // Cancels a call that has not started: it completes with Cancelled. The
  // part held for its start (Add(1) before it was posted) is finished here.
  bool Cancel() {
    Start expect = Start::kPending;
    if (!start.compare_exchange_strong(expect, Start::kCancelled)) return false;
    Finish(Status::Cancelled("the call was cancelled before it started"));
    return true;
  }

  void Add(int n = 1) {
    std::lock_guard<std::mutex> lock(mu);
    remaining += n;
  }
  // One part finished; the first error wins.
  void Finish(const Status& st) {
    std::vector<std::function<void(Status)>> run;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      if (!st.ok() && status.ok()) status = st;
      if (--remaining > 0) return;
      done = true;
      run.swap(then);
      if (run.empty()) ready.store(true, std::memory_order_release);
    }
    if (!run.empty()) {
      for (auto& fn : run) fn(status);
      std::lock_guard<std::mutex> lock(mu);
      ready.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
};

// A Future that has already failed with `st`.
inline Future FailedFuture(const Status& st) {
  auto state = std::make_shared<Future::State>();
  state->remaining = 1;
  state->Finish(st);
  return Future(state);
}

}  // namespace tessera
