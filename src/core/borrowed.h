// Borrowed<T>: a value kept across calls (a reply, a list of reports) taken
// for one call and put back when the call ends, so that its vectors keep
// their capacity and the hot path does not allocate them again. A nested
// call that borrows the same value finds it empty and allocates once; the
// outer call's value is the one put back, last.
#pragma once

#include <utility>

namespace tessera {

template <typename T>
class Borrowed {
 public:
  explicit Borrowed(T& home) : home_(home), value_(std::move(home)) {}
  ~Borrowed() { home_ = std::move(value_); }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;

  T& operator*() { return value_; }
  T* operator->() { return &value_; }

 private:
  T& home_;
  T value_;
};

}  // namespace tessera
