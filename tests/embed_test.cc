// An embedding table's parts on a shard, without sockets: where rows are
// placed, their index, their initial values, their updates against the
// double-precision reference, and their store's limits and memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/row_placement.h"
#include "embed/row_index.h"
#include "embed/row_initializer.h"
#include "embed/row_store.h"
#include "kernels/rows.h"
#include "kernels/update.h"
#include "optimizer_reference.h"

namespace tessera {
namespace {

using embed::RowIndex;
using embed::RowInitializer;
using embed::RowStore;
using embed::RowStoreOptions;

TEST(RowPlacement, SpreadsIdsEvenlyOverShards) {
  for (int shards : {1, 2, 3, 7, 16}) {
    RowPlacement placement(shards);
    std::vector<int> count(shards, 0);
    const int ids = 400000;
    // Consecutive ids, as a model's vocabulary numbers them.
    for (int64_t id = 0; id < ids; ++id) ++count[placement.ShardOf(id)];
    // A shard's share of the buckets is binomial: four of its standard
    // deviations (about 6% at 16 shards), and 1% for the ids' own draw.
    const double p = 1.0 / shards;
    const double tolerance = 4 * std::sqrt((1 - p) / (kRowBuckets * p)) + 0.01;
    for (int s = 0; s < shards; ++s) {
      EXPECT_NEAR(count[s], ids * p, tolerance * ids * p) << "shard " << s << " of " << shards;
    }
  }
}

TEST(RowPlacement, OneMoreShardMovesOnlyItsShareAndOnlyToIt) {
  for (int n : {1, 2, 5, 9}) {
    RowPlacement before(n), after(n + 1);
    uint32_t moved = 0;
    for (uint32_t b = 0; b < kRowBuckets; ++b) {
      if (before.ShardOfBucket(b) == after.ShardOfBucket(b)) continue;
      ++moved;
      ASSERT_EQ(after.ShardOfBucket(b), n) << "bucket " << b << " moved between old shards";
    }
    const double share = static_cast<double>(moved) / kRowBuckets;
    EXPECT_NEAR(share, 1.0 / (n + 1), 0.02) << n << " -> " << n + 1 << " shards";
  }
}

TEST(RowPlacement, NegativeAndExtremeIdsArePlaced) {
  RowPlacement placement(4);
  for (int64_t id : {INT64_MIN, int64_t{-1}, int64_t{0}, INT64_MAX}) {
    const int s = placement.ShardOf(id);
    EXPECT_GE(s, 0);
    EXPECT_LT(s, 4);
  }
}

// The index against std::unordered_map over a random mix of operations
// that grows it from its first size to a few hundred thousand ids, with
// erases throughout (while it grows too).
TEST(RowIndex, AgreesWithAMapThroughGrowthAndErases) {
  RowIndex index;
  std::unordered_map<int64_t, uint32_t> want;
  std::mt19937_64 rng(7);
  int growths = 0;
  bool was_growing = false;
  for (uint32_t op = 0; op < 600000; ++op) {
    const int64_t id = static_cast<int64_t>(rng() % 400000) - 200000;
    const uint32_t kind = rng() % 8;
    const auto it = want.find(id);
    if (kind < 5) {
      if (it == want.end()) {
        ASSERT_EQ(index.Find(id), RowIndex::kNoSlot) << "id " << id;
        ASSERT_TRUE(index.Insert(id, op));
        want[id] = op;
      } else {
        ASSERT_EQ(index.Find(id), it->second) << "id " << id;
      }
    } else if (kind < 7) {
      ASSERT_EQ(index.Erase(id), it != want.end()) << "id " << id;
      if (it != want.end()) want.erase(it);
    } else {
      ASSERT_EQ(index.Find(id), it == want.end() ? RowIndex::kNoSlot : it->second);
    }
    if (index.growing() && !was_growing) ++growths;
    was_growing = index.growing();
    ASSERT_EQ(index.size(), want.size());
  }
  EXPECT_GE(growths, 5) << "the index should have grown from 1024 entries";
  for (const auto& [id, slot] : want) ASSERT_EQ(index.Find(id), slot);
}

// Growth is spread over the operations after it: the insert that fills the
// table does not move the old entries at once, and lookups keep finding
// every id while they move.
TEST(RowIndex, GrowthMovesEntriesAFewPerOperation) {
  RowIndex index;
  int64_t next = 0;
  while (!index.growing()) {
    ASSERT_TRUE(index.Insert(next, static_cast<uint32_t>(next)));
    ++next;
  }
  const int64_t held = next;
  int operations = 0;
  while (index.growing()) {
    ++operations;
    const int64_t id = operations % held;
    ASSERT_EQ(index.Find(id), static_cast<uint32_t>(id));
  }
  // 1024 old entries at kMovesPerOperation each.
  EXPECT_GE(operations, 1024 / RowIndex::kMovesPerOperation - 2);
  for (int64_t id = 0; id < held; ++id) ASSERT_EQ(index.Find(id), static_cast<uint32_t>(id));
}

std::vector<float> InitialRow(const Initializer& init, int64_t id, uint32_t dim,
                              const char* table = "t") {
  auto maker = RowInitializer::Make(init, DType::kF32, dim, table);
  EXPECT_TRUE(maker.ok()) << maker.status().ToString();
  std::vector<float> row(dim);
  maker->Fill(id, row.data());
  return row;
}

TEST(RowInitializer, DependsOnSeedTableAndIdOnly) {
  const auto init = Initializer::Normal(0.0, 1.0, 5);
  const auto a = InitialRow(init, 42, 16);
  InitialRow(init, 7, 16);  // another row made in between changes nothing
  EXPECT_EQ(InitialRow(init, 42, 16), a);
  EXPECT_NE(InitialRow(init, 43, 16), a);
  EXPECT_NE(InitialRow(init, 42, 16, "other"), a);
  EXPECT_NE(InitialRow(Initializer::Normal(0.0, 1.0, 6), 42, 16), a);
  // A wider row starts with the same elements: element j is drawn from its own counter.
  const auto wide = InitialRow(init, 42, 32);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), wide.begin()));
}

TEST(RowInitializer, DrawsFollowTheirDistributions) {
  const uint32_t dim = 64;
  double sum = 0, sum2 = 0, lo = 1e9, hi = -1e9;
  size_t n = 0;
  auto take = [&](const Initializer& init) {
    sum = sum2 = 0;
    lo = 1e9;
    hi = -1e9;
    n = 0;
    for (int64_t id = 0; id < 2000; ++id) {
      for (float v : InitialRow(init, id * 7919, dim)) {
        sum += v;
        sum2 += static_cast<double>(v) * v;
        lo = std::min<double>(lo, v);
        hi = std::max<double>(hi, v);
        ++n;
      }
    }
  };
  take(Initializer::Uniform(-0.5, 1.5, 3));
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_GE(lo, -0.5);
  EXPECT_LT(hi, 1.5);
  take(Initializer::Normal(1.0, 2.0, 3));
  EXPECT_NEAR(sum / n, 1.0, 0.03);
  EXPECT_NEAR(std::sqrt(sum2 / n - (sum / n) * (sum / n)), 2.0, 0.03);
  take(Initializer::TruncatedNormal(0.0, 1.0, 3));
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_GE(lo, -2.0);
  EXPECT_LE(hi, 2.0);
  // A unit normal truncated at 2 has stddev 0.8796.
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.8796, 0.01);
  take(Initializer::Constant(0.25));
  EXPECT_EQ(lo, 0.25);
  EXPECT_EQ(hi, 0.25);
}

TEST(RowInitializer, HalvesAreTheRoundedDraws) {
  const auto init = Initializer::Uniform(-1.0, 1.0, 9);
  const uint32_t dim = 33;
  const auto f32 = InitialRow(init, 12345, dim);
  for (DType dt : {DType::kF16, DType::kBF16}) {
    auto maker = RowInitializer::Make(init, dt, dim, "t");
    ASSERT_TRUE(maker.ok());
    std::vector<uint16_t> row(dim);
    maker->Fill(12345, row.data());
    for (uint32_t j = 0; j < dim; ++j) {
      const float back = dt == DType::kF16 ? HalfToFloat(row[j]) : BFloat16ToFloat(row[j]);
      EXPECT_NEAR(back, f32[j], dt == DType::kF16 ? 1e-3 : 8e-3) << DTypeName(dt) << " " << j;
    }
  }
}

TEST(RowInitializer, RefusesWhatRowsCannotHaveByName) {
  auto glorot = RowInitializer::Make(Initializer::GlorotUniform(), DType::kF32, 8, "emb");
  ASSERT_FALSE(glorot.ok());
  EXPECT_NE(glorot.status().message().find("emb"), std::string::npos);
  EXPECT_NE(glorot.status().message().find("Glorot"), std::string::npos);
  auto ints = RowInitializer::Make(Initializer::Zeros(), DType::kI32, 8, "emb");
  ASSERT_FALSE(ints.ok());
  EXPECT_NE(ints.status().message().find("i32"), std::string::npos);
  EXPECT_FALSE(RowInitializer::Make(Initializer::Uniform(1, 1), DType::kF32, 8, "e").ok());
  EXPECT_FALSE(RowInitializer::Make(Initializer::Normal(0, 0), DType::kF32, 8, "e").ok());
}

double LoadAsDouble(DType dtype, const uint8_t* p) {
  uint16_t half;
  float f;
  switch (dtype) {
    case DType::kF16:
      std::memcpy(&half, p, 2);
      return HalfToFloat(half);
    case DType::kBF16:
      std::memcpy(&half, p, 2);
      return BFloat16ToFloat(half);
    default:
      std::memcpy(&f, p, 4);
      return f;
  }
}

struct RowCase {
  UpdateRule rule;
  DType dtype;
};

class RowUpdaterTest : public ::testing::TestWithParam<RowCase> {};

// Rows updated at different rates, each against the reference with its own
// step count: a row updated every 7th step gets Adam's bias correction for
// its own number of updates, not the table's.
TEST_P(RowUpdaterTest, EachRowMatchesTheReferenceWithItsOwnStepCount) {
  const auto [rule, dtype] = GetParam();
  const uint32_t dim = 37;  // no vector width divides it
  kernels::RowRule rr;
  rr.rule = rule;
  rr.dtype = dtype;
  rr.hyper.learning_rate = rule == UpdateRule::kFtrl ? 0.1f : 0.01f;
  rr.hyper.weight_decay = rule == UpdateRule::kFtrl ? 0.0f : 0.01f;
  rr.hyper.initial_accumulator = rule == UpdateRule::kAdagrad ? 0.1f : 0.0f;
  rr.ftrl.l1 = 0.01f;
  rr.ftrl.l2 = 0.02f;
  rr.ftrl.beta = 0.5f;
  auto updater = kernels::RowUpdater::Make(rr, dim);
  ASSERT_TRUE(updater.ok()) << updater.status().ToString();

  const size_t esize = DTypeSize(dtype);
  std::mt19937 rng(3);
  std::normal_distribution<double> dist(0.0, 1.0);
  const int kRows = 3;
  const int every[kRows] = {1, 3, 7};
  std::vector<std::vector<uint8_t>> value(kRows, std::vector<uint8_t>(dim * esize));
  std::vector<std::vector<float>> state(kRows, std::vector<float>(updater->state_floats()));
  std::vector<test::RefState> ref(kRows);
  std::vector<uint64_t> updates(kRows, 0);
  for (int r = 0; r < kRows; ++r) {
    ref[r].p.resize(dim);
    for (uint32_t j = 0; j < dim; ++j) {
      StoreAs(dtype, dist(rng), value[r].data() + j * esize);
      ref[r].p[j] = LoadAsDouble(dtype, value[r].data() + j * esize);
    }
    // Adagrad's accumulator starts at its initial value; FTRL's n (s1) too.
    ref[r].s0.assign(dim, rule == UpdateRule::kAdagrad ? rr.hyper.initial_accumulator : 0.0);
    ref[r].s1.assign(dim, rule == UpdateRule::kFtrl ? rr.ftrl.initial_accumulator : 0.0);
    updater->Reset(value[r].data(), state[r].data());
  }
  std::vector<float> grad(dim);
  std::vector<double> grad64(dim);
  for (int step = 1; step <= 70; ++step) {
    for (int r = 0; r < kRows; ++r) {
      if (step % every[r] != 0) continue;
      for (uint32_t j = 0; j < dim; ++j) grad64[j] = grad[j] = static_cast<float>(dist(rng));
      updater->Apply(value[r].data(), state[r].data(), grad.data(), ++updates[r]);
      test::ReferenceStep(rule, rr.hyper, ref[r], grad64, updates[r], rr.ftrl);
    }
  }
  const bool master = IsOptimizer(rule) && dtype != DType::kF32;
  for (int r = 0; r < kRows; ++r) {
    for (uint32_t j = 0; j < dim; ++j) {
      const double want = ref[r].p[j];
      // An optimizer's f32 master (halves) or f32 value follows the
      // reference to single-precision rounding; a plain rule on halves
      // rounds each update.
      const double got = master ? state[r][j] : LoadAsDouble(dtype, value[r].data() + j * esize);
      const double tol = (master || dtype == DType::kF32) ? 2e-5 : 2e-2;
      ASSERT_NEAR(got, want, tol * std::max(1.0, std::abs(want)))
          << UpdateRuleName(rule) << " " << DTypeName(dtype) << " row " << r << " element " << j;
    }
  }
}

std::vector<RowCase> RowCases() {
  std::vector<RowCase> out;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (UpdateRule r : {UpdateRule::kSgd, UpdateRule::kMomentum, UpdateRule::kAdam,
                         UpdateRule::kAdamW, UpdateRule::kAdagrad, UpdateRule::kFtrl}) {
      out.push_back({r, dt});
    }
  }
  return out;
}

std::string RowCaseName(const ::testing::TestParamInfo<RowCase>& c) {
  return std::string(UpdateRuleName(c.param.rule)) + "_" + DTypeName(c.param.dtype);
}

INSTANTIATE_TEST_SUITE_P(Rules, RowUpdaterTest, ::testing::ValuesIn(RowCases()), RowCaseName);

TEST(RowUpdater, FtrlZeroesWeightsWhoseLinearTermStaysWithinL1) {
  kernels::RowRule rr;
  rr.rule = UpdateRule::kFtrl;
  rr.hyper.learning_rate = 0.1f;
  rr.ftrl.l1 = 10.0f;  // far above what the gradients add up to
  auto updater = kernels::RowUpdater::Make(rr, 4);
  ASSERT_TRUE(updater.ok());
  std::vector<float> value = {0.5f, -0.5f, 0.0f, 1.0f};
  std::vector<float> state(updater->state_floats());
  updater->Reset(value.data(), state.data());
  const std::vector<float> grad = {0.1f, -0.2f, 0.3f, -0.4f};
  updater->Apply(value.data(), state.data(), grad.data(), 1);
  for (float v : value) EXPECT_EQ(v, 0.0f);
}

TEST(RowUpdater, RefusesByName) {
  kernels::RowRule rr;
  rr.rule = UpdateRule::kFtrl;
  rr.hyper.learning_rate = 0.0f;
  auto no_lr = kernels::RowUpdater::Make(rr, 4);
  ASSERT_FALSE(no_lr.ok());
  EXPECT_NE(no_lr.status().message().find("learning_rate"), std::string::npos);
  rr.hyper.learning_rate = 0.1f;
  rr.hyper.weight_decay = 0.1f;
  auto decay = kernels::RowUpdater::Make(rr, 4);
  ASSERT_FALSE(decay.ok());
  EXPECT_NE(decay.status().message().find("weight_decay"), std::string::npos);
  rr.hyper.weight_decay = 0.0f;
  rr.ftrl.l1 = -1.0f;
  auto l1 = kernels::RowUpdater::Make(rr, 4);
  ASSERT_FALSE(l1.ok());
  EXPECT_NE(l1.status().message().find("l1"), std::string::npos);
  rr.ftrl.l1 = 0.0f;
  rr.dtype = DType::kF64;
  auto f64 = kernels::RowUpdater::Make(rr, 4);
  ASSERT_FALSE(f64.ok());
  EXPECT_NE(f64.status().message().find("f64"), std::string::npos);
  rr.dtype = DType::kF32;
  EXPECT_FALSE(kernels::RowUpdater::Make(rr, 0).ok());
}

TEST(DenseRules, RefuseFtrlByName) {
  auto s = kernels::CheckRule(UpdateRule::kFtrl, DType::kF32);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("embedding"), std::string::npos);
  EXPECT_EQ(*ParseUpdateRule("ftrl"), UpdateRule::kFtrl);
}

RowStoreOptions AdagradRows(uint32_t dim, uint64_t max_rows) {
  RowStoreOptions o;
  o.table = "emb";
  o.rule.rule = UpdateRule::kAdagrad;
  o.rule.hyper.learning_rate = 0.05f;
  o.rule.hyper.initial_accumulator = 0.1f;
  o.dim = dim;
  o.initializer = Initializer::Uniform(-0.1, 0.1, 1);
  o.max_rows = max_rows;
  return o;
}

TEST(RowStore, MakesFindsUpdatesAndErasesRows) {
  auto store = RowStore::Make(AdagradRows(8, 100));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  RowStore& rows = **store;
  EXPECT_EQ(rows.Find(5), nullptr);
  std::vector<float> initial(8);
  rows.InitialValue(5, initial.data());
  auto made = rows.Create(5);
  ASSERT_TRUE(made.ok());
  embed::RowHeader* row = *made;
  EXPECT_EQ(row->id, 5);
  EXPECT_EQ(row->updates, 0u);
  EXPECT_EQ(std::memcmp(rows.Value(row), initial.data(), 32), 0);
  EXPECT_EQ(rows.State(row)[0], 0.1f);  // Adagrad's accumulator starts at its initial value
  EXPECT_EQ(rows.Find(5), row);
  const std::vector<float> grad(8, 1.0f);
  rows.Apply(row, grad.data(), 3);
  EXPECT_EQ(row->updates, 1u);
  EXPECT_EQ(row->last_updated, 3u);
  EXPECT_LT(static_cast<float*>(rows.Value(row))[0], initial[0]);
  EXPECT_EQ(rows.rows(), 1u);
  EXPECT_TRUE(rows.Erase(5));
  EXPECT_FALSE(rows.Erase(5));
  EXPECT_EQ(rows.Find(5), nullptr);
  EXPECT_EQ(rows.rows(), 0u);
  // Made again: at its initial value, with fresh state.
  auto again = rows.Create(5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(rows.Value(*again), initial.data(), 32), 0);
  EXPECT_EQ((*again)->updates, 0u);
}

TEST(RowStore, ALimitIsANamedErrorAndTheRowsStay) {
  auto store = RowStore::Make(AdagradRows(4, 3));
  ASSERT_TRUE(store.ok());
  RowStore& rows = **store;
  for (int64_t id = 0; id < 3; ++id) ASSERT_TRUE(rows.Create(id).ok());
  auto over = rows.Create(3);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("'emb'"), std::string::npos);
  EXPECT_NE(over.status().message().find("limit of 3 rows"), std::string::npos);
  EXPECT_EQ(rows.rows(), 3u);
  for (int64_t id = 0; id < 3; ++id) EXPECT_NE(rows.Find(id), nullptr);
  ASSERT_TRUE(rows.Erase(1));
  EXPECT_TRUE(rows.Create(3).ok()) << "a freed row makes room";
}

TEST(RowStore, ForEachVisitsEveryLiveRowOnce) {
  auto store = RowStore::Make(AdagradRows(4, 10000));
  ASSERT_TRUE(store.ok());
  RowStore& rows = **store;
  for (int64_t id = 0; id < 5000; ++id) ASSERT_TRUE(rows.Create(id * 3).ok());
  for (int64_t id = 0; id < 5000; id += 2) ASSERT_TRUE(rows.Erase(id * 3));
  std::map<int64_t, int> seen;
  rows.ForEach([&](embed::RowHeader* row) { ++seen[row->id]; });
  ASSERT_EQ(seen.size(), 2500u);
  for (const auto& [id, times] : seen) {
    EXPECT_EQ(times, 1);
    EXPECT_EQ(id % 6, 3) << "only the odd ids' rows are left";
  }
}

// What the rows and their index map, per row, against the row's value and
// optimizer state: the bound is 1.5x (dim 64, Adagrad, f32).
TEST(RowStore, MapsAtMostHalfAgainTheRowsPayload) {
  auto store = RowStore::Make(AdagradRows(64, 1u << 20));
  ASSERT_TRUE(store.ok());
  RowStore& rows = **store;
  for (int64_t id = 0; id < 300000; ++id) ASSERT_TRUE(rows.Create(id * 1000003).ok());
  const double per_row = static_cast<double>(rows.mapped_bytes()) / rows.rows();
  EXPECT_EQ(rows.payload_bytes(), 512u);
  EXPECT_LE(per_row, 1.5 * rows.payload_bytes()) << per_row << " bytes per row";
}

}  // namespace
}  // namespace tessera
