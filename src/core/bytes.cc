#include "core/bytes.h"

namespace tessera {

uint64_t Fnv1a64(std::span<const uint8_t> bytes, uint64_t seed) {
  uint64_t hash = seed;
  for (uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace tessera
