// Waiting on a Future: drive the client's progress, then sleep.

#include "client/future_state.h"
#include "core/spin.h"

namespace tessera {

Future Future::Failed(const Status& st) { return FailedFuture(st); }

Status Future::Wait() const {
  if (!state_) return Status::FailedPrecondition("waiting on an empty Future");
  return WaitFor(state_->timeout);
}

Status Future::WaitFor(std::chrono::milliseconds limit) const {
  if (!state_) return Status::FailedPrecondition("waiting on an empty Future");
  // A small call completes within microseconds: drive the client's progress
  // from this thread while work keeps coming, and for a moment after, before
  // paying for a sleep and a wake-up on the condition variable. The spin
  // never yields its core (beside a CPU hog that costs a whole slice) and
  // ends once this thread was descheduled (see core/spin.h).
  constexpr auto kSpin = std::chrono::microseconds(50);
  SpinWindow spin(kSpin);
  while (!state_->ready.load(std::memory_order_acquire)) {
    if (state_->driver && state_->driver->Drive()) {
      spin.Restart();
    } else if (!spin.Continue()) {
      break;
    }
  }
  // The answer came: this thread is likely back with its next call soon,
  // and the progress thread, napping meanwhile, takes over by itself if it
  // is not (PauseDriving). About to sleep instead: hand progress back now,
  // since the answer is the progress thread's to deliver.
  if (state_->driver) {
    if (state_->ready.load(std::memory_order_acquire)) {
      state_->driver->PauseDriving();
    } else {
      state_->driver->StopDriving();
    }
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, limit, [&] { return state_->ready.load(); })) {
    return Status::DeadlineExceeded("operation did not complete within " +
                                    std::to_string(limit.count()) + " ms");
  }
  return state_->status;
}

std::vector<DroppedChunk> Future::dropped() const {
  if (!state_) return {};
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->ready.load() ? state_->dropped : std::vector<DroppedChunk>{};
}

bool Future::Cancel() const { return state_ && state_->Cancel(); }

bool Future::ready() const { return state_ && state_->ready.load(std::memory_order_acquire); }

void Future::Then(std::function<void(Status)> fn) const {
  Status st;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) {
      state_->then.push_back(std::move(fn));
      return;
    }
    st = state_->status;
  }
  fn(st);
}

Status WaitAll(const std::vector<Future>& futures) {
  Status first;
  for (const Future& f : futures) {
    Status st = f.Wait();
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  return first;
}

}  // namespace tessera
