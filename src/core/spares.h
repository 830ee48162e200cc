// Spares<T>: values handed back after use (a decoded message whose call is
// done), kept for the next one so that their vectors keep their capacity.
// Where Borrowed<T> keeps one value for a call that ends before the next
// begins, this keeps a few: messages that wait (a pull for its step, a push
// for its readers) come back later and out of order. Bounded: beyond
// `kKept` values a returned one is dropped.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace tessera {

template <typename T>
class Spares {
 public:
  static constexpr size_t kKept = 16;

  Spares() { kept_.reserve(kKept); }
  // A kept value, or a new one when none is left.
  T Take() {
    if (kept_.empty()) return T{};
    T value = std::move(kept_.back());
    kept_.pop_back();
    return value;
  }
  void Give(T&& value) {
    if (kept_.size() < kKept) kept_.push_back(std::move(value));
  }
  size_t size() const { return kept_.size(); }

 private:
  std::vector<T> kept_;
};

}  // namespace tessera
