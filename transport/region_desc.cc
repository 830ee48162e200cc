#include "transport/region_desc.h"

#include <string>

#include "core/bytes.h"

namespace tessera::transport {
namespace {
constexpr uint32_t kMagic = 0x4b525354;  // "TSRK"
constexpr size_t kMaxKeyBytes = 64 * 1024;
}  // namespace

std::vector<uint8_t> EncodeRegionDesc(BackendId backend, uint64_t base, uint64_t size,
                                      std::span<const uint8_t> key) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Put(kMagic);
  w.Put(static_cast<uint8_t>(backend));
  w.Put(base);
  w.Put(size);
  w.PutBlob(key);
  w.Put(Fnv1a64(out));
  return out;
}

Result<RegionDesc> DecodeRegionDesc(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint8_t backend = 0;
  RegionDesc desc{};
  std::span<const uint8_t> key;
  if (!r.Get(&magic) || magic != kMagic) {
    return Status::InvalidArgument("remote key: bad magic (not a Tessera region description)");
  }
  if (!r.Get(&backend) || !r.Get(&desc.base) || !r.Get(&desc.size) ||
      !r.GetBlob(&key, kMaxKeyBytes)) {
    return Status::InvalidArgument("remote key: truncated or oversized description (" +
                                   std::to_string(bytes.size()) + " bytes)");
  }
  size_t covered = r.position();
  uint64_t checksum = 0;
  if (!r.Get(&checksum) || r.remaining() != 0) {
    return Status::InvalidArgument("remote key: bad length");
  }
  if (checksum != Fnv1a64(bytes.subspan(0, covered))) {
    return Status::InvalidArgument("remote key: checksum mismatch (corrupted key)");
  }
  if (backend < static_cast<uint8_t>(BackendId::kUcx) ||
      backend > static_cast<uint8_t>(BackendId::kTcp)) {
    return Status::InvalidArgument("remote key: unknown backend " + std::to_string(backend));
  }
  if (desc.base + desc.size < desc.base) {
    return Status::InvalidArgument("remote key: region wraps the address space");
  }
  desc.backend = static_cast<BackendId>(backend);
  desc.key = key;
  return desc;
}

}  // namespace tessera::transport
