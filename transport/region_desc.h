// The self-checking description of a region that peers exchange:
// magic, backend, base address, size, the backend's key bytes, checksum.
// A corrupted or forged-by-accident key is refused before the fabric sees it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/status.h"

namespace tessera::transport {

enum class BackendId : uint8_t { kUcx = 1, kVerbs = 2, kTcp = 3 };

struct RegionDesc {
  BackendId backend;
  uint64_t base;
  uint64_t size;
  std::span<const uint8_t> key;  // points into the decoded buffer
};

std::vector<uint8_t> EncodeRegionDesc(BackendId backend, uint64_t base, uint64_t size,
                                      std::span<const uint8_t> key);
Result<RegionDesc> DecodeRegionDesc(std::span<const uint8_t> bytes);

}  // namespace tessera::transport
