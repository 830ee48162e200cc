// Registered memory of the tcp backend. Nothing here is reachable by the
// fabric itself: a peer's put or get is a frame, and the target's progress
// thread does the copy after checking the region's random 128-bit key, its
// access and its bounds. A region is known by a small id and that key; the
// key is the capability, handed only to whom the layer above chooses.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "transport/region_desc.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/transport.h"

namespace tessera::transport::tcp {

// What a target needs to serve a peer's put or get.
struct RegionRecord {
  uint8_t* base = nullptr;
  size_t size = 0;
  RemoteAccess access = RemoteAccess::kReadWrite;
  RegionKey key{};
  // The serial of the only endpoint whose writes land here; 0: any.
  uint64_t writer = 0;
};

// The regions of one context, looked up by id on the progress thread and
// changed from any thread.
class RegionTable {
 public:
  // The table held still: no region is removed while a Pinned lives, so
  // memory that Find vouched for stays that region's. A one-sided transfer
  // pins the table for each piece it moves (a recv, a send, a copy), never
  // across a wait: a region freed between two pieces (its connection's slot
  // let go) ends the transfer instead of being written or read.
  class Pinned {
   public:
    // The address `addr` when `key` is region `id`'s key (compared in
    // constant time), its access allows `need` (a write: from endpoint
    // `requester`, where the region takes writes from one only), and
    // [addr, addr + len) lies inside it; an error naming what failed
    // otherwise.
    Result<uint8_t*> Find(uint32_t id, const RegionKey& key, uint64_t addr, uint64_t len,
                          RemoteAccess need, uint64_t requester) const;

   private:
    friend class RegionTable;
    explicit Pinned(const RegionTable& table) : table_(table), lock_(table.mu_) {}
    const RegionTable& table_;
    std::unique_lock<std::mutex> lock_;
  };

  uint32_t Add(const RegionRecord& record);
  void SetWriter(uint32_t id, uint64_t writer);
  // Waits for the piece of a transfer in progress to end: after it returns
  // no transfer reaches the region.
  void Remove(uint32_t id);
  Pinned Pin() const { return Pinned(*this); }

 private:
  mutable std::mutex mu_;
  uint32_t next_id_ = 1;
  std::unordered_map<uint32_t, RegionRecord> regions_;
};

class TcpRegion final : public Region {
 public:
  // `owned`: memory this region allocated (freed with it), else the caller's.
  TcpRegion(std::shared_ptr<RegionTable> table, RegionRecord record, bool owned);
  ~TcpRegion() override;
  void* data() const override { return record_.base; }
  size_t size() const override { return record_.size; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  std::vector<uint8_t> Describe() const override;
  Status TakeWritesOnlyFrom(Endpoint& writer) override;

 private:
  std::shared_ptr<RegionTable> table_;
  RegionRecord record_;
  uint32_t id_ = 0;
  bool owned_;
};

// A peer's region as its description gave it.
class TcpRemoteRegion final : public RemoteRegion {
 public:
  TcpRemoteRegion(const void* owner, uint32_t id, const RegionKey& key, uint64_t base,
                  uint64_t size)
      : owner_(owner), id_(id), key_(key), base_(base), size_(size) {}
  uint64_t base() const override { return base_; }
  uint64_t size() const override { return size_; }
  const void* owner() const { return owner_; }
  uint32_t id() const { return id_; }
  const RegionKey& key() const { return key_; }

 private:
  const void* owner_;  // the endpoint it was attached to
  uint32_t id_;
  RegionKey key_;
  uint64_t base_, size_;
};

// The key bytes of a description: region id, then the 16-byte key.
std::vector<uint8_t> EncodeTcpKey(uint32_t id, const RegionKey& key);
Result<std::pair<uint32_t, RegionKey>> DecodeTcpKey(std::span<const uint8_t> bytes);

}  // namespace tessera::transport::tcp
