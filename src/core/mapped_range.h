// How an address range of this process is mapped, as /proc/self/maps says:
// for memory another party told us the size of (a peer's region that a
// transport maps here), before this process copies into or out of it.
#pragma once

#include <cstddef>

namespace tessera {

enum class RangeMapping {
  kNotWhole,   // some byte is not mapped readable (or the map cannot be read)
  kReadOnly,   // every byte readable, some not writable
  kReadWrite,  // every byte readable and writable
};

// Reads the whole map: for a region's attach, not for each operation.
RangeMapping MappingOf(const void* p, size_t n);

}  // namespace tessera
