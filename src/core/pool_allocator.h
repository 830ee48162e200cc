// An allocator that keeps freed blocks for the next allocation of the same
// size class, for the few objects a client makes per call (a future's state,
// the lists of chunks per shard): in steady state a call then takes its
// memory from here instead of the heap. Blocks are shared process-wide, by
// size class (powers of two from 64 bytes to 64 KiB; larger ones come from
// the heap every time), and any thread may free what another allocated.
// Each class keeps a bounded number of free blocks (KeptIn), so what the
// pool holds is bounded (about 10 MiB in all): 1024 of each class up to
// 1 KiB, since a call of many tensors has that many small entries (a put's
// or get's record) in flight at once, and 64 of each larger class. Off
// under AddressSanitizer.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

namespace tessera {

namespace pool_internal {

// Under AddressSanitizer every block goes back to the heap, so that a use
// after free on the client's hot path is still caught.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kPooling = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kPooling = false;
#else
inline constexpr bool kPooling = true;
#endif
#else
inline constexpr bool kPooling = true;
#endif

inline constexpr size_t kMinBlock = 64;
inline constexpr size_t kMaxBlock = 64u << 10;
inline constexpr size_t kClasses = 11;  // 64 B .. 64 KiB
// How many free blocks of class `cls` are kept.
constexpr size_t KeptIn(size_t cls) { return (kMinBlock << cls) <= 1024 ? 1024 : 64; }

class FreeBlocks {
 public:
  static FreeBlocks& Instance() {
    // Never destroyed: blocks may be freed by threads that outlive statics.
    static auto* blocks = new FreeBlocks;
    return *blocks;
  }
  // The class of `bytes`, or kClasses when it is too large to keep.
  static size_t ClassOf(size_t bytes) {
    if (!kPooling || bytes > kMaxBlock) return kClasses;
    const size_t block = std::bit_ceil(bytes < kMinBlock ? kMinBlock : bytes);
    return static_cast<size_t>(std::countr_zero(block) - std::countr_zero(kMinBlock));
  }
  void* Take(size_t cls) {
    {
      std::lock_guard<std::mutex> lock(classes_[cls].mu);
      auto& free = classes_[cls].free;
      if (!free.empty()) {
        void* p = free.back();
        free.pop_back();
        return p;
      }
    }
    return ::operator new(kMinBlock << cls);
  }
  void Give(size_t cls, void* p) {
    {
      std::lock_guard<std::mutex> lock(classes_[cls].mu);
      auto& free = classes_[cls].free;
      if (free.size() < KeptIn(cls)) {
        free.push_back(p);  // within the capacity reserved below: no allocation
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  FreeBlocks() {
    for (size_t cls = 0; cls < kClasses; ++cls) classes_[cls].free.reserve(KeptIn(cls));
  }
  struct Class {
    std::mutex mu;
    std::vector<void*> free;
  };
  std::array<Class, kClasses> classes_;
};

}  // namespace pool_internal

template <typename T>
class PoolAllocator {
 public:
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                "over-aligned types are not pooled");

  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}  // NOLINT(google-explicit-constructor): rebinding

  // (T may itself be a pointer, as in a deque's map of blocks: the size of
  // a pointer is then what is meant.)
  static constexpr size_t kSize = sizeof(T);  // NOLINT(bugprone-sizeof-expression)

  T* allocate(size_t n) {
    const size_t cls = pool_internal::FreeBlocks::ClassOf(n * kSize);
    if (cls == pool_internal::kClasses) return static_cast<T*>(::operator new(n* kSize));
    return static_cast<T*>(pool_internal::FreeBlocks::Instance().Take(cls));
  }
  void deallocate(T* p, size_t n) {
    const size_t cls = pool_internal::FreeBlocks::ClassOf(n * kSize);
    if (cls == pool_internal::kClasses) return ::operator delete(p);
    pool_internal::FreeBlocks::Instance().Give(cls, p);
  }
  template <typename U>
  bool operator==(const PoolAllocator<U>&) const {
    return true;
  }
};

// A base that gives a class operator new and delete from the pool, for
// objects made per operation (a fabric's request state).
struct Pooled {
  static void* operator new(size_t bytes) { return PoolAllocator<std::byte>().allocate(bytes); }
  static void operator delete(void* p, size_t bytes) {
    PoolAllocator<std::byte>().deallocate(static_cast<std::byte*>(p), bytes);
  }
};

}  // namespace tessera
