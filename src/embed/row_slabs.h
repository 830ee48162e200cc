// The memory of a table's rows on one shard: blocks of about 2 MiB, each
// holding a power of two of rows of one stride, mapped as rows arrive and
// never moved, so that a row's address stays valid while it lives and no
// growth copies rows. A freed row's slot is handed out again before a new
// one. One thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::embed {

class RowSlabs {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  // `stride`: bytes per row, a multiple of 16; `max_rows`: the most it holds.
  RowSlabs(size_t stride, uint64_t max_rows);
  ~RowSlabs();
  RowSlabs(const RowSlabs&) = delete;
  RowSlabs& operator=(const RowSlabs&) = delete;

  // A free slot, or kNoSlot at max_rows or where no memory could be mapped.
  uint32_t Allocate();
  void Free(uint32_t slot);

  uint8_t* At(uint32_t slot) const {
    return blocks_[slot >> block_shift_] + (slot & block_mask_) * stride_;
  }
  bool InUse(uint32_t slot) const { return (in_use_bits_[slot >> 6] >> (slot & 63)) & 1; }
  // Slots below this were handed out at some time: where a walk over the
  // rows ends.
  uint32_t end() const { return end_; }
  size_t in_use() const { return in_use_; }
  uint64_t max_rows() const { return max_rows_; }
  uint64_t mapped_bytes() const;

 private:
  void Mark(uint32_t slot, bool used);

  size_t stride_;
  uint64_t max_rows_;
  uint32_t block_shift_;
  uint32_t block_mask_;
  std::vector<uint8_t*> blocks_;
  std::vector<uint64_t> in_use_bits_;
  std::vector<uint32_t> free_;
  uint32_t end_ = 0;
  size_t in_use_ = 0;
};

}  // namespace tessera::embed
