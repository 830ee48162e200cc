// RingQueue<T>: a FIFO that keeps its storage. std::deque frees a block of
// elements when its last one is popped and allocates one when the next push
// crosses into it: a queue that a frame passes through on every call costs
// an allocation every few calls. This one holds its elements in one array
// that only grows (doubling) and is reused as they come and go, so that in
// steady state a push and a pop allocate nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace tessera {

template <typename T>
class RingQueue {
 public:
  RingQueue() = default;
  RingQueue(RingQueue&& other) noexcept { *this = std::move(other); }
  RingQueue& operator=(RingQueue&& other) noexcept {
    if (this != &other) {
      clear();
      slots_ = std::move(other.slots_);
      capacity_ = std::exchange(other.capacity_, 0);
      head_ = std::exchange(other.head_, 0);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  RingQueue(const RingQueue&) = delete;
  RingQueue& operator=(const RingQueue&) = delete;
  ~RingQueue() { clear(); }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

  T& front() { return *Slot(0); }
  T& operator[](size_t i) { return *Slot(i); }
  const T& operator[](size_t i) const { return *Slot(i); }

  void push_back(T value) {
    Reserve(size_ + 1);
    new (Slot(size_)) T(std::move(value));
    ++size_;
  }
  void push_front(T value) {
    Reserve(size_ + 1);
    head_ = (head_ + capacity_ - 1) & (capacity_ - 1);
    new (Slot(0)) T(std::move(value));
    ++size_;
  }
  void pop_front() {
    Slot(0)->~T();
    head_ = (head_ + 1) & (capacity_ - 1);
    --size_;
  }
  // Gives the storage back when the queue is empty and holds more than
  // `keep` slots, so that a burst (a peer that stopped reading) does not
  // stay held once it has drained.
  void ReleaseIfEmptyAbove(size_t keep) {
    if (size_ != 0 || capacity_ <= keep) return;
    slots_.reset();
    capacity_ = 0;
    head_ = 0;
  }
  // Destroys every element; the storage stays for what comes next.
  void clear() {
    while (size_ > 0) pop_front();
    head_ = 0;
  }

 private:
  // Raw storage for one element: constructed only while it is in the queue.
  struct alignas(T) Storage {
    unsigned char bytes[sizeof(T)];
  };

  T* Slot(size_t i) const {
    return std::launder(reinterpret_cast<T*>(slots_[(head_ + i) & (capacity_ - 1)].bytes));
  }
  void Reserve(size_t n) {
    if (n <= capacity_) return;
    size_t grown = capacity_ == 0 ? 8 : capacity_ * 2;
    while (grown < n) grown *= 2;
    auto slots = std::make_unique<Storage[]>(grown);
    for (size_t i = 0; i < size_; ++i) {
      T* from = Slot(i);
      new (slots[i].bytes) T(std::move(*from));
      from->~T();
    }
    slots_ = std::move(slots);
    capacity_ = grown;
    head_ = 0;
  }

  std::unique_ptr<Storage[]> slots_;
  size_t capacity_ = 0;  // a power of two, or 0
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace tessera
