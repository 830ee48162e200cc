// A std::function that keeps callables up to `Capacity` bytes inside itself.
// libstdc++'s std::function stores only trivially copyable callables of at
// most 16 bytes in place: a lambda holding a shared_ptr or a vector costs a
// heap allocation each time it is made, which the client's per-call
// callbacks (a reply handler, a push's completion) must not. Larger
// callables still work, on the heap, so that rare paths need no care; so do
// callables whose move may throw, e.g. a lambda that captured a `const&`
// parameter by copy (its member is const, so moving it copies): capture
// `x = T(x)` instead to keep such a lambda in place.
#pragma once

#include <cstddef>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

namespace tessera {

template <typename Signature, size_t Capacity>
class InlineFunction;

template <typename R, typename... Args, size_t Capacity>
class InlineFunction<R(Args...), Capacity> {
 public:
  InlineFunction() = default;
  InlineFunction(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): as std::function
  template <typename F, typename D = std::decay_t<F>,
            typename = std::enable_if_t<!std::is_same_v<D, InlineFunction> &&
                                        std::is_invocable_r_v<R, D&, Args...>>>
  InlineFunction(F&& f) {  // NOLINT(google-explicit-constructor): as std::function
    if constexpr (kFitsInside<D>) {
      new (storage_) D(std::forward<F>(f));
      ops_ = &kInsideOps<D>;
    } else {
      new (storage_) D*(new D(std::forward<F>(f)));
      ops_ = &kOnHeapOps<D>;
    }
  }
  InlineFunction(const InlineFunction& other) : ops_(other.ops_) {
    if (ops_ != nullptr) ops_->copy(storage_, other.storage_);
  }
  InlineFunction(InlineFunction&& other) noexcept : ops_(other.ops_) {
    if (ops_ != nullptr) ops_->move(storage_, other.storage_);
    other.ops_ = nullptr;
  }
  InlineFunction& operator=(const InlineFunction& other) {
    if (this != &other) *this = InlineFunction(other);
    return *this;
  }
  InlineFunction& operator=(InlineFunction&& other) noexcept {
    if (this != &other) {
      Reset();
      ops_ = other.ops_;
      if (ops_ != nullptr) ops_->move(storage_, other.storage_);
      other.ops_ = nullptr;
    }
    return *this;
  }
  InlineFunction& operator=(std::nullptr_t) {
    Reset();
    return *this;
  }
  ~InlineFunction() { Reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  R operator()(Args... args) const {
    if (ops_ == nullptr) throw std::bad_function_call();
    return ops_->invoke(const_cast<unsigned char*>(storage_), std::forward<Args>(args)...);
  }

 private:
  struct Ops {
    R (*invoke)(void* self, Args&&... args);
    void (*copy)(void* to, const void* from);
    void (*move)(void* to, void* from);  // and destroys `from`
    void (*destroy)(void* self);
  };
  template <typename D>
  static constexpr bool kFitsInside =
      sizeof(D) <= Capacity &&
      alignof(D) <= alignof(std::max_align_t) && std::is_nothrow_move_constructible_v<D>;
  template <typename D>
  static constexpr Ops kInsideOps = {
      [](void* self, Args&&... args) -> R {
        return std::invoke(*static_cast<D*>(self), std::forward<Args>(args)...);
      },
      [](void* to, const void* from) { new (to) D(*static_cast<const D*>(from)); },
      [](void* to, void* from) {
        new (to) D(std::move(*static_cast<D*>(from)));
        static_cast<D*>(from)->~D();
      },
      [](void* self) { static_cast<D*>(self)->~D(); },
  };
  template <typename D>
  static constexpr Ops kOnHeapOps = {
      [](void* self, Args&&... args) -> R {
        return std::invoke(**static_cast<D**>(self), std::forward<Args>(args)...);
      },
      [](void* to, const void* from) { new (to) D*(new D(**static_cast<D* const*>(from))); },
      [](void* to, void* from) { new (to) D*(*static_cast<D**>(from)); },
      [](void* self) { delete *static_cast<D**>(self); },
  };
  void Reset() {
    if (ops_ != nullptr) ops_->destroy(storage_);
    ops_ = nullptr;
  }

  alignas(
      std::max_align_t) unsigned char storage_[Capacity < sizeof(void*) ? sizeof(void*) : Capacity];
  const Ops* ops_ = nullptr;
};

}  // namespace tessera
