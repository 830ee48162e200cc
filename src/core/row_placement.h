// Which ps task holds an embedding row. An id's bucket is a hash of the id
// (one of kRowBuckets, the same for every shard count); a bucket's shard is
// the jump consistent hash of the bucket over the shard count (Lamping and
// Veach, 2014). Rows are spread evenly whatever ids a model uses, and a
// change of shard count from n to n+1 moves only the buckets that go to the
// new shard (about 1/(n+1) of them): a restore onto another count, and the
// replication of later issues, move buckets, not single ids. Worker and
// shard compute it alike; nothing of it travels.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// A 64-bit finaliser (splitmix64's): every bit of the result depends on
// every bit of the input, so ids that differ in a few low bits (1, 2, 3 ...)
// land far apart.
constexpr uint64_t MixBits(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The bucket [0, n) a key goes to, such that going from n to n+1 buckets
// moves a key only to the new one.
int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets);

inline constexpr uint32_t kRowBuckets = 1u << 16;

class RowPlacement {
 public:
  // `num_shards` >= 1 (at most 65535).
  explicit RowPlacement(int num_shards);
  static uint32_t BucketOf(int64_t id) {
    return static_cast<uint32_t>(MixBits(static_cast<uint64_t>(id)) >> 48);
  }
  int ShardOfBucket(uint32_t bucket) const { return shard_of_bucket_[bucket]; }
  int ShardOf(int64_t id) const { return shard_of_bucket_[BucketOf(id)]; }
  int num_shards() const { return num_shards_; }

 private:
  int num_shards_;
  // 128 KiB: one lookup per id on the worker's hot path instead of the
  // hash's loop.
  std::vector<uint16_t> shard_of_bucket_;
};

}  // namespace tessera
