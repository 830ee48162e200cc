#include "core/heap_counter.h"

#include <atomic>

namespace tessera {
namespace {
// Constant-initialised: a registration from another translation unit's
// static initialiser finds it ready.
constinit std::atomic<HeapAllocationCounter> g_counter{nullptr};
}  // namespace

void SetHeapAllocationCounter(HeapAllocationCounter counter) {
  g_counter.store(counter, std::memory_order_release);
}

std::optional<uint64_t> HeapAllocationsSoFar() {
  const HeapAllocationCounter counter = g_counter.load(std::memory_order_acquire);
  if (counter == nullptr) return std::nullopt;
  return counter();
}

}  // namespace tessera
