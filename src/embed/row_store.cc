#include "embed/row_store.h"

#include <cstring>

namespace tessera::embed {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

Result<std::unique_ptr<RowStore>> RowStore::Make(const RowStoreOptions& options) {
  const std::string who = "embedding table '" + options.table + "'";
  if (options.max_rows == 0) return Status::InvalidArgument(who + ": max_rows must be >= 1");
  if (options.max_rows > RowIndex::kMaxSlot) {
    return Status::InvalidArgument(who + ": max_rows " + std::to_string(options.max_rows) +
                                   " per shard is over the limit of " +
                                   std::to_string(RowIndex::kMaxSlot));
  }
  auto updater = kernels::RowUpdater::Make(options.rule, options.dim);
  if (!updater.ok()) return updater.status().WithContext(who);
  auto initializer =
      RowInitializer::Make(options.initializer, options.rule.dtype, options.dim, options.table);
  if (!initializer.ok()) return initializer.status();
  return std::unique_ptr<RowStore>(new RowStore(options, *initializer, *updater));
}

RowStore::RowStore(const RowStoreOptions& options, RowInitializer initializer,
                   kernels::RowUpdater updater)
    : table_(options.table),
      dim_(options.dim),
      value_bytes_(size_t{options.dim} * DTypeSize(options.rule.dtype)),
      state_offset_(kValueOffset + RoundUp(value_bytes_, sizeof(float))),
      stride_(RoundUp(state_offset_ + updater.state_floats() * sizeof(float), 16)),
      initializer_(initializer),
      updater_(updater),
      slabs_(stride_, options.max_rows) {}

Result<RowHeader*> RowStore::Create(int64_t id) {
  const uint32_t slot = slabs_.Allocate();
  if (slot == RowSlabs::kNoSlot) {
    if (slabs_.in_use() >= slabs_.max_rows()) {
      return Status::ResourceExhausted("embedding table '" + table_ + "' holds its limit of " +
                                       std::to_string(slabs_.max_rows()) + " rows on this shard");
    }
    return Status::ResourceExhausted("embedding table '" + table_ +
                                     "': no memory could be mapped for another row");
  }
  RowHeader* row = Header(slot);
  *row = {id, 0, 0};
  initializer_.Fill(id, Value(row));
  updater_.Reset(Value(row), State(row));
  if (!index_.Insert(id, slot)) {
    slabs_.Free(slot);
    return Status::ResourceExhausted("embedding table '" + table_ +
                                     "': no memory could be mapped for its index");
  }
  return row;
}

bool RowStore::Erase(int64_t id) {
  const uint32_t slot = index_.Find(id);
  if (slot == RowIndex::kNoSlot) return false;
  (void)index_.Erase(id);
  slabs_.Free(slot);
  return true;
}

}  // namespace tessera::embed
