#include "core/row_placement.h"

namespace tessera {

// The loop of Lamping and Veach's paper: a linear congruential walk over the
// buckets the key would jump to as n grows, stopping at the last one below n.
int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets) {
  int64_t bucket = -1;
  int64_t next = 0;
  while (next < num_buckets) {
    bucket = next;
    key = key * 2862933555777941757ULL + 1;
    next = static_cast<int64_t>(
        static_cast<double>(bucket + 1) *
        (static_cast<double>(1LL << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int32_t>(bucket);
}

RowPlacement::RowPlacement(int num_shards)
    : num_shards_(num_shards), shard_of_bucket_(kRowBuckets) {
  for (uint32_t b = 0; b < kRowBuckets; ++b) {
    shard_of_bucket_[b] = static_cast<uint16_t>(JumpConsistentHash(MixBits(b), num_shards));
  }
}

}  // namespace tessera
