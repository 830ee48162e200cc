// A process that counts its heap allocations (the `tessera` tool replaces
// operator new to do so, tools/alloc_counter.cc) registers its counter
// here, so that the library can report it without depending on the tool:
// a shard's status carries it, and `tessera bench` reads it to count the
// shard's allocations per call. A process that registers nothing (a
// trainer linking the library) reports none.
#pragma once

#include <cstdint>
#include <optional>

namespace tessera {

using HeapAllocationCounter = uint64_t (*)();

// Registers the process's counter; the last registration wins.
void SetHeapAllocationCounter(HeapAllocationCounter counter);

// The process's heap allocations so far, or nothing when it does not count.
std::optional<uint64_t> HeapAllocationsSoFar();

}  // namespace tessera
