#include "core/mapped_range.h"

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace tessera {

RangeMapping MappingOf(const void* p, size_t n) {
  auto at = reinterpret_cast<uintptr_t>(p);
  if (n == 0) return RangeMapping::kReadWrite;
  if (at > UINTPTR_MAX - n) return RangeMapping::kNotWhole;
  const uintptr_t end = at + n;
  bool writable = true;
  std::ifstream maps("/proc/self/maps");
  // The lines come sorted by address: walk them, moving `at` over each
  // readable mapping that covers it, until the range is covered or a gap
  // shows.
  std::string line;
  while (at < end && std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3) continue;
    if (hi <= at) continue;
    if (lo > at || perms[0] != 'r') break;
    writable = writable && perms[1] == 'w';
    at = hi;
  }
  if (at < end) return RangeMapping::kNotWhole;
  return writable ? RangeMapping::kReadWrite : RangeMapping::kReadOnly;
}

}  // namespace tessera
