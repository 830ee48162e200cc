#include "embed/row_index.h"

#include <sys/mman.h>

#include <random>

#include "core/row_placement.h"

namespace tessera::embed {
namespace {

constexpr size_t kFirstCapacity = 1024;

uint64_t RandomSalt() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

}  // namespace

RowIndex::RowIndex() : salt_(RandomSalt()), live_(MapTable(kFirstCapacity)) {}

RowIndex::~RowIndex() {
  UnmapTable(&live_);
  UnmapTable(&old_);
}

RowIndex::Table RowIndex::MapTable(size_t capacity) {
  void* p = mmap(nullptr, capacity * sizeof(Entry), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return {};
  return {static_cast<Entry*>(p), capacity, 0};
}

void RowIndex::UnmapTable(Table* t) {
  if (t->entries) munmap(t->entries, t->capacity * sizeof(Entry));
  *t = {};
}

uint64_t RowIndex::mapped_bytes() const { return (live_.capacity + old_.capacity) * sizeof(Entry); }

size_t RowIndex::Home(int64_t id, const Table& t) const {
  return MixBits(static_cast<uint64_t>(id) ^ salt_) & (t.capacity - 1);
}

size_t RowIndex::Probe(const Table& t, int64_t id) const {
  const size_t mask = t.capacity - 1;
  for (size_t i = Home(id, t);; i = (i + 1) & mask) {
    const Entry& e = t.entries[i];
    if (e.slot_plus_1 == 0) return t.capacity;
    if (e.id == id && e.slot_plus_1 != kTombstone) return i;
  }
}

void RowIndex::Put(Table* t, int64_t id, uint32_t slot_plus_1) {
  const size_t mask = t->capacity - 1;
  size_t i = Home(id, *t);
  while (t->entries[i].slot_plus_1 != 0) i = (i + 1) & mask;
  t->entries[i] = {id, slot_plus_1, 0};
  ++t->used;
}

// Linear probing's deletion without tombstones: each later entry of the run
// that may sit at the hole (its home is not between the hole and itself)
// moves back into it, and the hole moves on to where it was.
void RowIndex::RemoveShifting(Table* t, size_t at) {
  const size_t mask = t->capacity - 1;
  size_t hole = at;
  for (size_t j = (hole + 1) & mask; t->entries[j].slot_plus_1 != 0; j = (j + 1) & mask) {
    const size_t home = Home(t->entries[j].id, *t);
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      t->entries[hole] = t->entries[j];
      hole = j;
    }
  }
  t->entries[hole] = {};
  --t->used;
}

// An old entry is visited once, and an id is inserted only where it is in
// neither table, so what is moved is never in the live table already.
void RowIndex::MoveSome(int count) {
  while (growing() && count-- > 0) {
    if (old_cursor_ == old_.capacity) {
      UnmapTable(&old_);
      return;
    }
    const Entry& e = old_.entries[old_cursor_++];
    if (e.slot_plus_1 != 0 && e.slot_plus_1 != kTombstone) Put(&live_, e.id, e.slot_plus_1);
  }
  if (growing() && old_cursor_ == old_.capacity) UnmapTable(&old_);
}

uint32_t RowIndex::Find(int64_t id) {
  MoveSome(kMovesPerOperation);
  size_t i = Probe(live_, id);
  if (i != live_.capacity) return live_.entries[i].slot_plus_1 - 1;
  if (growing()) {
    i = Probe(old_, id);
    if (i != old_.capacity) return old_.entries[i].slot_plus_1 - 1;
  }
  return kNoSlot;
}

bool RowIndex::Insert(int64_t id, uint32_t slot) {
  MoveSome(kMovesPerOperation);
  if ((live_.used + 1) * 4 > live_.capacity * 3) {
    // Moves outpace inserts by kMovesPerOperation to 1, so the last growth
    // has always finished by now; finish it where a caller broke the pace.
    if (growing()) MoveSome(static_cast<int>(old_.capacity));
    Table next = MapTable(live_.capacity * 2);
    if (next.entries) {
      old_ = live_;
      old_cursor_ = 0;
      live_ = next;
      MoveSome(kMovesPerOperation);
    } else if ((live_.used + 1) * 16 > live_.capacity * 15) {
      return false;  // no address space for a larger table, and this one is full
    }
  }
  Put(&live_, id, slot + 1);
  ++size_;
  return true;
}

bool RowIndex::Erase(int64_t id) {
  MoveSome(kMovesPerOperation);
  bool erased = false;
  const size_t i = Probe(live_, id);
  if (i != live_.capacity) {
    RemoveShifting(&live_, i);
    erased = true;
  }
  if (growing()) {
    const size_t j = Probe(old_, id);
    if (j != old_.capacity) {
      old_.entries[j].slot_plus_1 = kTombstone;
      erased = true;
    }
  }
  if (erased) --size_;
  return erased;
}

}  // namespace tessera::embed
