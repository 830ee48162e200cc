// Where each id's row is: an open-addressing table of (id, slot) with linear
// probing, 16 bytes an entry, at most 3/4 full. It grows without stopping
// the world: a full table gets a successor twice its size, and every
// operation after that moves a few of the old table's entries across
// (kMovesPerOperation) until none are left, looking up in both meanwhile.
// So no call ever waits for a whole table to be rehashed, whatever its size.
// Its tables are anonymous mappings: a new one costs no zeroing up front.
// Ids are placed by a hash salted per process, so that ids chosen to collide
// cannot be computed in advance. One thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::embed {

class RowIndex {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  // Slots are below this.
  static constexpr uint32_t kMaxSlot = UINT32_MAX - 2;

  RowIndex();
  ~RowIndex();
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // The id's slot, or kNoSlot.
  uint32_t Find(int64_t id);
  // Adds an id that is not in the index; false where no memory could be
  // mapped for it.
  [[nodiscard]] bool Insert(int64_t id, uint32_t slot);
  // Removes the id; false where it was not there.
  bool Erase(int64_t id);

  size_t size() const { return size_; }
  // The bytes its tables map (the old one too while it moves).
  uint64_t mapped_bytes() const;
  bool growing() const { return old_.entries != nullptr; }

  static constexpr int kMovesPerOperation = 8;

 private:
  struct Entry {
    int64_t id;
    uint32_t slot_plus_1;  // 0: empty (as a fresh mapping reads); kTombstone: erased
    uint32_t unused;
  };
  static constexpr uint32_t kTombstone = UINT32_MAX;
  struct Table {
    Entry* entries = nullptr;
    size_t capacity = 0;  // a power of two
    size_t used = 0;      // entries held (the live table: not tombstones)
  };

  size_t Home(int64_t id, const Table& t) const;
  static Table MapTable(size_t capacity);
  static void UnmapTable(Table* t);
  // Where the id is in `t`, or capacity.
  size_t Probe(const Table& t, int64_t id) const;
  void Put(Table* t, int64_t id, uint32_t slot_plus_1);
  void RemoveShifting(Table* t, size_t at);
  void MoveSome(int count);

  uint64_t salt_;
  Table live_;
  Table old_;  // being moved into live_, from old_cursor_ on
  size_t old_cursor_ = 0;
  size_t size_ = 0;
};

}  // namespace tessera::embed
