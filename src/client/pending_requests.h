// The requests a client waits for answers to, by request id. A flat table
// whose slots are reused: in steady state adding and taking a request
// allocates nothing (an unordered_map allocates a node for each). The id
// names the slot and a sequence number, so a late or forged answer to a
// request that is gone finds nothing. Loop thread only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tessera::client {

template <typename Fn>
class PendingRequests {
 public:
  // Holds `fn` for an answer from `shard`; returns the request's id (never 0).
  uint64_t Add(int shard, Fn fn) {
    uint32_t index;
    if (free_.empty()) {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    } else {
      index = free_.back();
      free_.pop_back();
    }
    Slot& s = slots_[index];
    // The sequence wraps after 2^32 requests, past 0, which marks a free slot.
    if (++seq_ == 0) ++seq_;
    s.id = (uint64_t{seq_} << kIndexBits) | index;
    s.shard = shard;
    s.fn = std::move(fn);
    size_++;
    return s.id;
  }

  // Takes out the request `id`: false when there is none (answered, failed
  // or given up already).
  bool Take(uint64_t id, Fn* fn, int* shard = nullptr) {
    Slot* s = Find(id);
    if (s == nullptr) return false;
    *fn = std::move(s->fn);
    if (shard != nullptr) *shard = s->shard;
    Free(*s);
    return true;
  }
  void Erase(uint64_t id) {
    if (Slot* s = Find(id)) Free(*s);
  }

  // Takes out every request to `shard`, into `out`.
  void TakeAllOf(int shard, std::vector<Fn>* out) {
    for (Slot& s : slots_) {
      if (s.id == 0 || s.shard != shard) continue;
      out->push_back(std::move(s.fn));
      Free(s);
    }
  }
  void Clear() {
    for (Slot& s : slots_) {
      if (s.id != 0) Free(s);
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr int kIndexBits = 32;
  struct Slot {
    uint64_t id = 0;  // 0: free
    int shard = -1;
    Fn fn;
  };
  Slot* Find(uint64_t id) {
    const uint64_t index = id & ((uint64_t{1} << kIndexBits) - 1);
    if (id == 0 || index >= slots_.size() || slots_[index].id != id) return nullptr;
    return &slots_[index];
  }
  void Free(Slot& s) {
    s.fn = nullptr;
    free_.push_back(static_cast<uint32_t>(s.id & ((uint64_t{1} << kIndexBits) - 1)));
    s.id = 0;
    size_--;
  }

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;  // indices of free slots, the latest freed last
  uint32_t seq_ = 0;
  size_t size_ = 0;
};

}  // namespace tessera::client
