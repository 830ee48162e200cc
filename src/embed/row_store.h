// One table's rows on one shard: each row is a header (its id, its own
// update count for Adam's bias correction, the step it was last updated
// at), its value in the table's dtype, and its optimizer state, in one
// stride of slab memory; an index finds a row by id. A row is made by its
// first update (a pull of an id that has none reads the initializer's
// value, which depends on the id alone, and stores nothing). One thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "embed/row_index.h"
#include "embed/row_initializer.h"
#include "embed/row_slabs.h"
#include "kernels/rows.h"
#include "tessera/status.h"

namespace tessera::embed {

struct RowHeader {
  int64_t id;
  uint32_t updates;       // updates applied to it (Adam's t)
  uint32_t last_updated;  // the table's step counter when it was last updated
};
static_assert(sizeof(RowHeader) == 16);

struct RowStoreOptions {
  std::string table;  // for errors
  kernels::RowRule rule;
  uint32_t dim = 0;
  Initializer initializer;
  uint64_t max_rows = 0;  // on this shard
};

class RowStore {
 public:
  // An error naming what the options cannot make (see RowUpdater::Make and
  // RowInitializer::Make; max_rows 0).
  static Result<std::unique_ptr<RowStore>> Make(const RowStoreOptions& options);
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // The row's header, or nullptr.
  RowHeader* Find(int64_t id) {
    const uint32_t slot = index_.Find(id);
    return slot == RowIndex::kNoSlot ? nullptr : Header(slot);
  }
  // A new row for an id that has none, at its initial value with fresh
  // state; ResourceExhausted at max_rows (or where no memory is left).
  Result<RowHeader*> Create(int64_t id);
  // Removes the id's row; false where it had none.
  bool Erase(int64_t id);

  void* Value(RowHeader* row) const { return reinterpret_cast<uint8_t*>(row) + kValueOffset; }
  float* State(RowHeader* row) const {
    return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(row) + state_offset_);
  }
  // The id's initial value (its row's, before any update), written to `out`.
  void InitialValue(int64_t id, void* out) const { initializer_.Fill(id, out); }
  // One update of the row by its f32 gradient; counts it, marks it with `step`.
  void Apply(RowHeader* row, const float* grad, uint32_t step) {
    row->last_updated = step;
    updater_.Apply(Value(row), State(row), grad, ++row->updates);
  }

  // Every row, in slot order: fn(RowHeader*).
  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (uint32_t s = 0; s < slabs_.end(); ++s) {
      if (slabs_.InUse(s)) fn(Header(s));
    }
  }

  size_t rows() const { return slabs_.in_use(); }
  uint32_t dim() const { return dim_; }
  size_t value_bytes() const { return value_bytes_; }
  size_t stride() const { return stride_; }
  const kernels::RowRule& rule() const { return updater_.rule(); }
  // What its rows and index map (resident once touched).
  uint64_t mapped_bytes() const { return slabs_.mapped_bytes() + index_.mapped_bytes(); }
  // Bytes of a row's value and optimizer state: what it holds for the model.
  size_t payload_bytes() const { return value_bytes_ + updater_.state_floats() * sizeof(float); }

 private:
  static constexpr size_t kValueOffset = sizeof(RowHeader);
  RowStore(const RowStoreOptions& options, RowInitializer initializer, kernels::RowUpdater updater);
  RowHeader* Header(uint32_t slot) const { return reinterpret_cast<RowHeader*>(slabs_.At(slot)); }

  std::string table_;
  uint32_t dim_;
  size_t value_bytes_;
  size_t state_offset_;
  size_t stride_;
  RowInitializer initializer_;
  kernels::RowUpdater updater_;
  RowIndex index_;
  RowSlabs slabs_;
};

}  // namespace tessera::embed
