#include "embed/row_slabs.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>

namespace tessera::embed {
namespace {

constexpr size_t kBlockBytes = size_t{2} << 20;

}  // namespace

RowSlabs::RowSlabs(size_t stride, uint64_t max_rows)
    : stride_(stride), max_rows_(std::min<uint64_t>(max_rows, kNoSlot - 1)) {
  const size_t rows_per_block = std::bit_floor(std::max<size_t>(1, kBlockBytes / stride));
  block_shift_ = static_cast<uint32_t>(std::countr_zero(rows_per_block));
  block_mask_ = static_cast<uint32_t>(rows_per_block - 1);
}

RowSlabs::~RowSlabs() {
  const size_t block_bytes = (size_t{block_mask_} + 1) * stride_;
  for (uint8_t* b : blocks_) munmap(b, block_bytes);
}

uint64_t RowSlabs::mapped_bytes() const {
  return blocks_.size() * (uint64_t{block_mask_} + 1) * stride_ + in_use_bits_.size() * 8 +
         free_.capacity() * sizeof(uint32_t);
}

void RowSlabs::Mark(uint32_t slot, bool used) {
  const uint64_t bit = uint64_t{1} << (slot & 63);
  if (used) {
    in_use_bits_[slot >> 6] |= bit;
  } else {
    in_use_bits_[slot >> 6] &= ~bit;
  }
}

uint32_t RowSlabs::Allocate() {
  if (in_use_ >= max_rows_) return kNoSlot;
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if ((end_ >> block_shift_) == blocks_.size()) {
      const size_t block_bytes = (size_t{block_mask_} + 1) * stride_;
      void* p = mmap(nullptr, block_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return kNoSlot;
      blocks_.push_back(static_cast<uint8_t*>(p));
      in_use_bits_.resize(((blocks_.size() << block_shift_) + 63) / 64, 0);
    }
    slot = end_++;
  }
  Mark(slot, true);
  ++in_use_;
  return slot;
}

void RowSlabs::Free(uint32_t slot) {
  Mark(slot, false);
  --in_use_;
  free_.push_back(slot);
}

}  // namespace tessera::embed
