// A client's declared tensors: each one's declaration, first value and
// chunks (where they live on which shard), by handle and by name, and the
// steps the cluster's declares and init said to start from. Any thread,
// under its lock: a call's checks and split hold it once for the whole batch
// (Lock, then the *Locked reads); the other members take it themselves.
// Entries are only added, so a pointer to one (and to its chunks) stays
// valid while the table lives.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/client.h"
#include "wire/messages.h"

namespace tessera::client {

// One chunk of a tensor: its elements, the shard holding them and where.
struct Chunk {
  int shard;
  uint64_t elem_offset, elem_count, byte_offset, bytes;
  uint32_t key_id = 0, arena_id = 0;
  uint64_t arena_offset = 0;
};

// A declared tensor: the one declaration every layer shares (modes filled
// in, the hyper-parameters in effect), how the chief makes its first value,
// and where its chunks live.
struct TensorEntry {
  wire::TensorDecl decl;
  std::vector<uint8_t> initial;  // TensorSpec::initial
  Initializer initializer;       // when `initial` is empty
  uint64_t bytes;
  std::vector<Chunk> chunks;
  bool restored = false;     // the shards loaded it from a checkpoint
  bool initialized = false;  // the chief initialised it already
};

// What every call reads of a declared tensor, one short dense entry each: a
// batch's checks and split then touch one cache line per two tensors
// instead of each declaration's heap objects, whose dependent loads were
// most of a 256-tensor call's split (perf). None of it changes after the
// declare.
struct TensorHot {
  const TensorEntry* entry;
  const Chunk* chunks;  // entry->chunks, in place
  uint64_t bytes;
  uint32_t chunk_count;
  DType dtype;
  Consistency kind;
};

class TensorTable {
 public:
  // `client_id`: the id the client's handles carry.
  explicit TensorTable(uint32_t client_id) : client_id_(client_id) {}
  TensorTable(const TensorTable&) = delete;
  TensorTable& operator=(const TensorTable&) = delete;

  std::unique_lock<std::mutex> Lock() const { return std::unique_lock<std::mutex>(mu_); }

  // With the lock held. The entry of `t` if the buffer fits it (its bytes,
  // and its dtype where given), else why not, naming the tensor.
  Result<const TensorEntry*> LookupLocked(Tensor t, size_t bytes, std::optional<DType> dtype,
                                          bool check_bytes = true) const;
  // LookupLocked's checks without their errors: the entry, or null when
  // LookupLocked would fail (inline, for the items of a batch).
  const TensorHot* MatchLocked(Tensor t, size_t bytes, std::optional<DType> dtype) const {
    if (t.client != client_id_ || t.index >= hot_.size()) return nullptr;
    const TensorHot* h = &hot_[t.index];
    if ((dtype && *dtype != h->dtype) || bytes != h->bytes) return nullptr;
    return h;
  }
  // Every entry, by handle index, to read or change (its chunks' keys, once
  // a restarted shard made them again; its hyper-parameters; whether it is
  // initialised).
  std::deque<TensorEntry>& EntriesLocked() { return entries_; }

  // Taking the lock.
  Result<const TensorEntry*> Lookup(Tensor t, size_t bytes, std::optional<DType> dtype,
                                    bool check_bytes = true) const;
  Result<TensorInfo> Info(Tensor t) const;
  Result<Tensor> Find(const std::string& name) const;
  // Declared entries, in order: their handles (one declared before under
  // the same name keeps its own). `restored_step`: the global step of the
  // checkpoint the cluster resumed from, where any entry was restored.
  std::vector<Tensor> Add(std::vector<TensorEntry> entries, uint64_t restored_step);
  // Every entry is initialised, and the workers start from `step`.
  void Initialized(uint64_t step);
  void SetStartStep(uint64_t step);
  std::optional<uint64_t> restored_step() const;
  std::optional<uint64_t> start_step() const;

  // Why `t` is no handle of this client's: another client's (a closed one,
  // whose index would name another tensor here), none's, or never issued.
  Status ForeignHandle(Tensor t) const;

 private:
  const uint32_t client_id_;
  mutable std::mutex mu_;
  std::deque<TensorEntry> entries_;  // index = Tensor::index
  std::vector<TensorHot> hot_;       // index = Tensor::index
  std::unordered_map<std::string, uint32_t> by_name_;
  std::optional<uint64_t> restored_step_;  // from the coordinator's declare replies
  // From the chief's Initialize, or the coordinator's answer to WaitForInit.
  std::optional<uint64_t> start_step_;
};

}  // namespace tessera::client
