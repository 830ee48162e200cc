// A row's initial value as a function of the table's seed and the row's id
// alone: whichever shard makes the row, and whenever, it gets the same
// bytes, so that a run repeats and a table restored onto another number of
// ps tasks (or a row evicted and made again) starts where it would have.
// Each element is drawn from its own counter (seed, id, element), not from a
// stream that rows share.
#pragma once

#include <cstdint>
#include <string_view>

#include "tessera/client.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::embed {

class RowInitializer {
 public:
  // An error naming what does not suit a table of rows: Glorot's kinds need
  // a fixed shape, a random kind a floating dtype, a range low < high, a
  // normal stddev > 0.
  static Result<RowInitializer> Make(const Initializer& init, DType dtype, uint32_t dim,
                                     std::string_view table);
  // Writes row `id`'s dim elements of the table's dtype into `value`.
  void Fill(int64_t id, void* value) const;

 private:
  RowInitializer(const Initializer& init, DType dtype, uint32_t dim, uint64_t seed)
      : init_(init), dtype_(dtype), dim_(dim), seed_(seed) {}
  double Draw(uint64_t row_key, uint32_t element) const;

  Initializer init_;
  DType dtype_;
  uint32_t dim_;
  uint64_t seed_;  // the initializer's seed mixed with the table's name
};

}  // namespace tessera::embed
