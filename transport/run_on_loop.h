// Runs a function on a context's progress thread and waits for its result:
// for the few calls (listen, attach, describe) that must touch progress-thread
// state from a user thread and answer synchronously.
#pragma once

#include <future>

#include "transport/transport.h"

namespace tessera::transport {

template <typename Fn>
auto RunOnLoop(Context& ctx, Fn fn) -> decltype(fn()) {
  if (ctx.InProgressThread()) return fn();
  std::promise<decltype(fn())> promise;
  auto future = promise.get_future();
  ctx.Post([&] { promise.set_value(fn()); });
  return future.get();
}

}  // namespace tessera::transport
