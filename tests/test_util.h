// Helpers shared by the test suites.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "tessera/status.h"

namespace tessera::testing {

// A one-shot completion a test can wait on with a bound.
template <typename T>
class Waiter {
 public:
  Waiter() : promise_(std::make_shared<std::promise<T>>()), future_(promise_->get_future()) {}
  auto callback() {
    return [p = promise_](T value) { p->set_value(std::move(value)); };
  }
  // Fails the calling test (via the optional) when nothing arrives in time.
  std::optional<T> Wait(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    if (future_.wait_for(limit) != std::future_status::ready) return std::nullopt;
    return future_.get();
  }

 private:
  std::shared_ptr<std::promise<T>> promise_;
  std::future<T> future_;
};

// A TCP port on 127.0.0.1 that nothing listens on right now.
uint16_t UnusedPort();

}  // namespace tessera::testing
