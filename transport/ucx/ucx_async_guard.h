// Keeps UCX's per-process table of async handlers consistent across the
// UCX contexts of one process, for a UCX that does not itself.
//
// UCX before 1.18 queues an event its async thread could not hand to a busy
// worker in that worker's "missed" queue under the socket's descriptor
// number, and leaves it there when the socket's handler is removed (fixed
// upstream by openucx/ucx b9c293b). When another worker of the process
// opens a socket that gets the same number (the kernel hands out the lowest
// free one) before the first worker drains its queue, the first worker
// delivers the stale event against the second worker's handler: UCX asserts
// (`handler->async == async`) and aborts the process. CI saw it: a server
// refused one client while another client of the same process connected.
//
// A worker drains its queue at the end of every ucp_worker_progress. So each
// context drives UCX in stretches under its own lock, and ends a stretch
// that closed something after its last progress call with one more
// (settle); a call that opens a socket UCX watches (a worker, a listener, a
// client's endpoint) runs while every other context is between stretches,
// that is, holds no stale event. Stretches of different contexts still run
// side by side: only opening a connection waits for the others.
//
// Left open: sockets UCX's own async thread opens (a listener accepting a
// connection) are outside any lock of ours; for them the window is the
// inside of one progress call, from a close to that call's end.
#pragma once

#include <functional>
#include <mutex>

#include "transport/event_loop.h"

namespace tessera::transport::ucx {

class UcxAsyncGuard final : public StretchGuard {
 public:
  // Whether the UCX this process loaded needs the guard.
  static bool Needed();

  // `settle` drains the context's worker (one ucp_worker_progress) when
  // something was closed since its last progress; it must not be called
  // inside ucp_worker_progress.
  explicit UcxAsyncGuard(std::function<void()> settle);
  ~UcxAsyncGuard() override;
  UcxAsyncGuard(const UcxAsyncGuard&) = delete;
  UcxAsyncGuard& operator=(const UcxAsyncGuard&) = delete;

  bool Enter(bool wait) override;
  void Leave() override;

  // Runs `open`, a UCX call that may open a socket UCX watches, while no
  // other context is inside a stretch. Called inside this context's own
  // stretch (and no other), or outside any stretch; never from within
  // ucp_worker_progress. Elsewhere, where waiting for the others could
  // deadlock, `open` runs unguarded.
  void Exclusively(const std::function<void()>& open);

 private:
  std::mutex stretch_mu_;  // held through each of this context's stretches
  const std::function<void()> settle_;
};

}  // namespace tessera::transport::ucx
