// What every backend's Context does the same way: it runs its progress on
// one EventLoop (event_loop.h), and the Context calls about posting work
// and driving progress only hand over to that loop. The backend owns its
// loop (where it sits among the backend's members decides what it outlives
// at teardown) and hands it here once it has made it.
#pragma once

#include <chrono>
#include <functional>

#include "transport/event_loop.h"
#include "transport/transport.h"

namespace tessera::transport {

class LoopContext : public Context {
 public:
  void Post(Task fn) final { loop_->Post(std::move(fn)); }
  void PostAfter(std::chrono::milliseconds delay, std::function<void()> fn) final {
    loop_->PostAfter(delay, std::move(fn));
  }
  bool InProgressThread() const final { return loop_->InLoopThread(); }
  bool Drive() final { return loop_->Drive(); }
  bool RunHere(Task& fn) final { return loop_->RunHere(fn); }
  void StopDriving() final { loop_->StopDriving(); }
  void PauseDriving() final { loop_->PauseDriving(); }

 protected:
  // Before the context is handed to anyone (the backend's Init).
  void UseLoop(EventLoop* loop) { loop_ = loop; }
  // The loop's own counters, into a backend's counters().
  void AddLoopCounters(Counters& c) const {
    c.progress_wakeups = loop_->wakeups();
    c.progress_nap_ends = loop_->nap_ends();
    c.progress_long_naps = loop_->long_naps();
  }

 private:
  EventLoop* loop_ = nullptr;
};

}  // namespace tessera::transport
