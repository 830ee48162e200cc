#include "transport/tcp/tcp_region.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/mman.h>

#include <cstring>

#include "core/bytes.h"

namespace tessera::transport::tcp {

uint32_t RegionTable::Add(const RegionRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  while (next_id_ == 0 || regions_.count(next_id_) != 0) next_id_++;
  const uint32_t id = next_id_++;
  regions_[id] = record;
  return id;
}

void RegionTable::SetWriter(uint32_t id, uint64_t writer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = regions_.find(id); it != regions_.end()) it->second.writer = writer;
}

void RegionTable::Remove(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(id);
}

Result<uint8_t*> RegionTable::Pinned::Find(uint32_t id, const RegionKey& key, uint64_t addr,
                                           uint64_t len, RemoteAccess need,
                                           uint64_t requester) const {
  auto it = table_.regions_.find(id);
  if (it == table_.regions_.end()) {
    return Status::PermissionDenied("no region " + std::to_string(id));
  }
  const RegionRecord& r = it->second;
  if (CRYPTO_memcmp(r.key.data(), key.data(), key.size()) != 0) {
    return Status::PermissionDenied("wrong key for region " + std::to_string(id));
  }
  if ((static_cast<uint8_t>(r.access) & static_cast<uint8_t>(need)) == 0) {
    return Status::PermissionDenied(std::string("region ") + std::to_string(id) + " is not " +
                                    (need == RemoteAccess::kWrite ? "writable" : "readable"));
  }
  if (need == RemoteAccess::kWrite && r.writer != 0 && r.writer != requester) {
    return Status::PermissionDenied("region " + std::to_string(id) +
                                    " takes one-sided writes only from the connection it was "
                                    "given to");
  }
  const auto base = reinterpret_cast<uint64_t>(r.base);
  if (addr < base || len > r.size || addr - base > r.size - len) {
    return Status::OutOfRange(std::to_string(len) + " bytes at an address outside region " +
                              std::to_string(id));
  }
  return r.base + (addr - base);
}

TcpRegion::TcpRegion(std::shared_ptr<RegionTable> table, RegionRecord record, bool owned)
    : table_(std::move(table)), record_(record), owned_(owned) {
  id_ = table_->Add(record_);
}

TcpRegion::~TcpRegion() {
  table_->Remove(id_);
  if (owned_ && record_.base != nullptr) munmap(record_.base, record_.size);
}

Status TcpRegion::TakeWritesOnlyFrom(Endpoint& writer) {
  table_->SetWriter(id_, writer.serial());
  return Status::Ok();
}

std::vector<uint8_t> TcpRegion::Describe() const {
  return EncodeRegionDesc(BackendId::kTcp, reinterpret_cast<uint64_t>(record_.base), record_.size,
                          EncodeTcpKey(id_, record_.key));
}

std::vector<uint8_t> EncodeTcpKey(uint32_t id, const RegionKey& key) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Put(id);
  w.PutBytes(key);
  return out;
}

Result<std::pair<uint32_t, RegionKey>> DecodeTcpKey(std::span<const uint8_t> bytes) {
  if (bytes.size() != 4 + sizeof(RegionKey)) {
    return Status::InvalidArgument("remote key: " + std::to_string(bytes.size()) +
                                   " bytes, not a tcp key");
  }
  ByteReader r(bytes);
  uint32_t id = 0;
  std::span<const uint8_t> key;
  (void)(r.Get(&id) && r.GetBytes(sizeof(RegionKey), &key));
  RegionKey out{};
  std::memcpy(out.data(), key.data(), out.size());
  return std::make_pair(id, out);
}

}  // namespace tessera::transport::tcp
