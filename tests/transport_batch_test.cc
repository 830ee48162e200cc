// The transport contract for batches of one-sided operations (PutMany,
// GetMany), on every backend (BackendCases), issued from a user thread and
// from the progress thread (where UCX over shared memory copies the pieces
// itself).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <random>
#include <utility>
#include <vector>

#include "tests/transport_fixture.h"
#include "transport/region_desc.h"

namespace tessera::transport {
namespace {

enum class From { kUserThread, kProgressThread };

// Pieces of 1 to 5000 bytes, each at its own place in one local buffer and
// at the peer, with gaps between them on both sides that no piece touches.
struct Layout {
  std::vector<RmaPiece> pieces;
  std::vector<uint64_t> local_offsets, remote_offsets;
  uint64_t local_bytes = 0, remote_bytes = 0, total = 0;
};

Layout MakeLayout(uint8_t* local, uint64_t remote_base, size_t n, uint32_t seed) {
  Layout l;
  std::mt19937 rng(seed);
  std::vector<size_t> lens(n);
  for (auto& len : lens) len = 1 + rng() % 5000;
  uint64_t at_local = 3, at_remote = 1;  // unaligned from the start
  for (size_t len : lens) {
    l.local_offsets.push_back(at_local);
    l.remote_offsets.push_back(at_remote);
    at_local += len + 1 + rng() % 9;
    at_remote += len + 1 + rng() % 13;
    l.total += len;
  }
  l.local_bytes = at_local;
  l.remote_bytes = at_remote;
  for (size_t i = 0; i < n; ++i) {
    l.pieces.push_back({local == nullptr ? nullptr : local + l.local_offsets[i], lens[i],
                        remote_base + l.remote_offsets[i]});
  }
  return l;
}

// Bytes covered by the layout's pieces, on the side `offsets` describes.
std::vector<bool> Covered(const Layout& l, const std::vector<uint64_t>& offsets, uint64_t bytes) {
  std::vector<bool> covered(bytes, false);
  for (size_t i = 0; i < l.pieces.size(); ++i) {
    for (size_t b = 0; b < l.pieces[i].len; ++b) covered[offsets[i] + b] = true;
  }
  return covered;
}

class BatchTest : public TransportTest {
 protected:
  // Issues `op` (a PutMany or GetMany) from `from`, and waits for its one
  // completion; a second completion, or one after the flush that follows,
  // fails the case.
  Status Batch(From from, const std::function<void(Completion)>& op) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    auto first = std::make_shared<std::promise<Status>>();
    auto result = first->get_future();
    Completion done = [calls, first](Status st) {
      if (calls->fetch_add(1) == 0) first->set_value(std::move(st));
    };
    if (from == From::kUserThread) {
      op(std::move(done));
    } else {
      client_ctx_->Post([op, done = std::move(done)]() mutable { op(std::move(done)); });
    }
    if (result.wait_for(30s) != std::future_status::ready) {
      return Status::DeadlineExceeded("the batch did not complete in 30 s");
    }
    Status st = result.get();
    EXPECT_TRUE(Wait([&](Completion c) { ep_->Flush(std::move(c)); }).ok());
    EXPECT_EQ(calls->load(), 1) << "a batch completes once";
    return st;
  }

  void PutsAndGetsEveryPiece(From from) {
    auto* region = static_cast<uint8_t*>(server_region_->data());
    std::vector<uint8_t> src;
    Layout put = MakeLayout(nullptr, remote_->base(), 97, 5);
    src.resize(put.local_bytes);
    std::mt19937 rng(17);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    put = MakeLayout(src.data(), remote_->base(), 97, 5);
    std::memset(region, 0x11, put.remote_bytes);
    const Counters before = client_ctx_->counters();

    Status st =
        Batch(from, [&](Completion c) { ep_->PutMany(put.pieces, *remote_, std::move(c)); });
    ASSERT_TRUE(st.ok()) << st.ToString();
    const auto covered = Covered(put, put.remote_offsets, put.remote_bytes);
    for (size_t i = 0; i < put.pieces.size(); ++i) {
      ASSERT_EQ(std::memcmp(region + put.remote_offsets[i], put.pieces[i].local, put.pieces[i].len),
                0)
          << "piece " << i << " of " << put.pieces[i].len << " bytes";
    }
    for (uint64_t b = 0; b < put.remote_bytes; ++b) {
      if (!covered[b]) {
        ASSERT_EQ(region[b], 0x11) << "a put wrote between pieces, at " << b;
      }
    }

    // Back, into other places with other gaps.
    std::vector<uint8_t> back(put.local_bytes + 4096, 0xee);
    Layout get = MakeLayout(back.data(), remote_->base(), 97, 5);
    Status got =
        Batch(from, [&](Completion c) { ep_->GetMany(get.pieces, *remote_, std::move(c)); });
    ASSERT_TRUE(got.ok()) << got.ToString();
    const auto written = Covered(get, get.local_offsets, back.size());
    for (size_t i = 0; i < get.pieces.size(); ++i) {
      ASSERT_EQ(std::memcmp(back.data() + get.local_offsets[i], region + get.remote_offsets[i],
                            get.pieces[i].len),
                0)
          << "piece " << i;
    }
    for (uint64_t b = 0; b < back.size(); ++b) {
      if (!written[b]) {
        ASSERT_EQ(back[b], 0xee) << "a get wrote between pieces, at " << b;
      }
    }

    // Each piece counts as the put or get it is.
    const Counters after = client_ctx_->counters();
    EXPECT_EQ(after.puts - before.puts, put.pieces.size());
    EXPECT_EQ(after.put_bytes - before.put_bytes, put.total);
    EXPECT_EQ(after.gets - before.gets, get.pieces.size());
    EXPECT_EQ(after.get_bytes - before.get_bytes, get.total);
  }

  void RefusesAPieceOutsideTheRegion(From from) {
    std::vector<uint8_t> buf(64, 0x5a);
    const uint64_t base = remote_->base();
    const std::vector<RmaPiece> pieces = {
        {buf.data(), 8, base + 100},
        {buf.data(), 16, base + kRegionSize - 8},  // 8 bytes past the end
        {buf.data(), 8, base + 200},
    };
    Status put = Batch(from, [&](Completion c) { ep_->PutMany(pieces, *remote_, std::move(c)); });
    EXPECT_EQ(put.code(), StatusCode::kOutOfRange) << put.ToString();
    Status get = Batch(from, [&](Completion c) { ep_->GetMany(pieces, *remote_, std::move(c)); });
    EXPECT_EQ(get.code(), StatusCode::kOutOfRange) << get.ToString();
  }
};

TEST_P(BatchTest, PutManyAndGetManyMoveEveryPieceFromAUserThread) {
  PutsAndGetsEveryPiece(From::kUserThread);
}

TEST_P(BatchTest, PutManyAndGetManyMoveEveryPieceFromTheProgressThread) {
  PutsAndGetsEveryPiece(From::kProgressThread);
}

TEST_P(BatchTest, ABatchWithAPieceOutsideTheRegionIsRefusedOnce) {
  RefusesAPieceOutsideTheRegion(From::kUserThread);
  RefusesAPieceOutsideTheRegion(From::kProgressThread);
}

TEST_P(BatchTest, AnEmptyBatchCompletesAtOnce) {
  for (From from : {From::kUserThread, From::kProgressThread}) {
    EXPECT_TRUE(Batch(from, [&](Completion c) { ep_->PutMany({}, *remote_, std::move(c)); }).ok());
    EXPECT_TRUE(Batch(from, [&](Completion c) { ep_->GetMany({}, *remote_, std::move(c)); }).ok());
  }
}

// A peer's region description that claims more bytes than the memory
// behind its key: where this process maps the peer's memory and copies
// into it itself (UCX over shared memory), attaching it is refused, since
// a copy within the claimed size would run past the mapping. Elsewhere
// the claim maps nothing here: the target checks bounds (Tessera's tcp,
// verbs), or nothing does (UCX's tcp, docs/security.md).
TEST_P(BatchTest, ARegionLargerThanItsMappingIsNotCopiedInto) {
  // The decoded key is a view into the description: keep it alive.
  const std::vector<uint8_t> described = server_region_->Describe();
  auto desc = DecodeRegionDesc(described);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  const std::vector<uint8_t> key(desc->key.begin(), desc->key.end());
  const auto inflated = EncodeRegionDesc(desc->backend, desc->base, desc->size + (1ull << 40), key);
  auto attached = ep_->Attach(inflated);
  if (std::string(GetParam().name) != "shm") {
    if (attached.ok()) {
      GTEST_SKIP() << "this transport does not map the peer's memory here: the claim is the "
                      "target's to check, or nobody's (docs/security.md)";
    }
    return;
  }
  ASSERT_FALSE(attached.ok()) << "a region 1 TiB larger than its mapping was attached";
  EXPECT_NE(attached.status().message().find("more than UCX mapped"), std::string::npos)
      << attached.status().ToString();
  // The true description still attaches, and copies into it.
  EXPECT_TRUE(ep_->Attach(server_region_->Describe()).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchTest, BackendCases(), BackendCaseName);

}  // namespace
}  // namespace tessera::transport
