// The backends' two ways onto a context's progress thread: RunOnProgress for
// an endpoint's calls (at once when already there, else posted), and
// RunOnLoop for the few calls (listen, attach, describe) that must touch
// progress-thread state from a user thread and answer synchronously.
#pragma once

#include <future>
#include <utility>

#include "transport/transport.h"

namespace tessera::transport {

// Runs `fn` on the progress thread of `ctx`: now when the caller is on it,
// else posted, holding `owner` (an endpoint, via shared_from_this) alive
// until it has run.
template <typename Owner, typename Fn>
void RunOnProgress(Context& ctx, Owner* owner, Fn fn) {
  if (ctx.InProgressThread()) return fn();
  ctx.Post([self = owner->shared_from_this(), fn = std::move(fn)]() mutable { fn(); });
}

template <typename Fn>
auto RunOnLoop(Context& ctx, Fn fn) -> decltype(fn()) {
  if (ctx.InProgressThread()) return fn();
  std::promise<decltype(fn())> promise;
  auto future = promise.get_future();
  ctx.Post([&] { promise.set_value(fn()); });
  return future.get();
}

}  // namespace tessera::transport
