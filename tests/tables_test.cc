// The shard's tables, without sockets: a request reaches the one table
// serving its opcode, no opcode is served twice, and a checkpoint round's
// cut is begun on every table and dropped on all of them when one cannot.
#include <gtest/gtest.h>

#include "server/sync_row_steps.h"
#include "server/tables.h"

#include <map>
#include <vector>

namespace tessera::server {
namespace {

// A table of the test's own: what the shard asks of it, counted.
class CountingTable final : public Table {
 public:
  CountingTable(std::string_view kind, std::vector<wire::Opcode> ops, Result<bool> cut)
      : kind_(kind), ops_(std::move(ops)), cut_(std::move(cut)) {}
  std::string_view kind() const override { return kind_; }
  size_t entries() const override { return 0; }
  uint64_t held_bytes() const override { return 7; }
  std::vector<wire::Opcode> Opcodes() const override { return ops_; }
  void OnRequest(Peer&, const wire::Header&, std::span<const uint8_t>) override { ++requests; }
  void Ready(const wire::JoinReply&) override {}
  void RetryWaiting() override {}
  void OnPeerGone(const Peer&) override {}
  void Begin() override {}
  void Stop() override {}
  void Release() override {}
  void AddStats(ServerStats*) const override {}
  uint64_t SyncStepReached() const override { return step; }
  void AddToJoin(std::vector<wire::Join>*) const override {}
  void ReportForPrepare(wire::CkptPrepared*) const override {}
  Result<bool> BeginCut(CutRound*) override {
    ++cuts_begun;
    return cut_;
  }
  void DropCut() override { ++cuts_dropped; }

  int requests = 0, cuts_begun = 0, cuts_dropped = 0;
  uint64_t step = 0;

 private:
  std::string_view kind_;
  std::vector<wire::Opcode> ops_;
  Result<bool> cut_;
};

TEST(Tables, EachOpcodeReachesTheTableServingIt) {
  Tables tables;
  auto dense = std::make_unique<CountingTable>(
      "dense", std::vector{wire::Opcode::kPush, wire::Opcode::kPull}, true);
  auto rows = std::make_unique<CountingTable>("rows", std::vector{wire::Opcode::kCreate}, true);
  Table* d = dense.get();
  Table* r = rows.get();
  ASSERT_TRUE(tables.Add(std::move(dense)).ok());
  ASSERT_TRUE(tables.Add(std::move(rows)).ok());
  EXPECT_EQ(tables.For(wire::Opcode::kPush), d);
  EXPECT_EQ(tables.For(wire::Opcode::kPull), d);
  EXPECT_EQ(tables.For(wire::Opcode::kCreate), r);
  EXPECT_EQ(tables.For(wire::Opcode::kSyncStep), nullptr);
  EXPECT_EQ(tables.For(static_cast<wire::Opcode>(wire::kMaxOpcode + 1)), nullptr);
  EXPECT_EQ(tables.For(static_cast<wire::Opcode>(0xffff)), nullptr);
  EXPECT_EQ(tables.held_bytes(), 14u);
}

TEST(Tables, AnOpcodeServedTwiceIsRefusedNamingBothTables) {
  Tables tables;
  ASSERT_TRUE(
      tables.Add(std::make_unique<CountingTable>("dense", std::vector{wire::Opcode::kPush}, true))
          .ok());
  Status st =
      tables.Add(std::make_unique<CountingTable>("rows", std::vector{wire::Opcode::kPush}, true));
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("dense"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rows"), std::string::npos) << st.message();
}

TEST(Tables, TheFurthestSyncStepOfAnyTable) {
  Tables tables;
  auto a = std::make_unique<CountingTable>("a", std::vector<wire::Opcode>{}, true);
  auto b = std::make_unique<CountingTable>("b", std::vector<wire::Opcode>{}, true);
  a->step = 4;
  b->step = 9;
  ASSERT_TRUE(tables.Add(std::move(a)).ok());
  ASSERT_TRUE(tables.Add(std::move(b)).ok());
  EXPECT_EQ(tables.SyncStepReached(), 9u);
}

TEST(Tables, ACutCountsTheTablesThatCopyLater) {
  Tables tables;
  auto now = std::make_unique<CountingTable>("now", std::vector<wire::Opcode>{}, true);
  auto later = std::make_unique<CountingTable>("later", std::vector<wire::Opcode>{}, false);
  ASSERT_TRUE(tables.Add(std::move(now)).ok());
  ASSERT_TRUE(tables.Add(std::move(later)).ok());
  CutRound round;
  auto behind = tables.BeginCut(&round);
  ASSERT_TRUE(behind.ok());
  EXPECT_EQ(*behind, 1u);
}

TEST(Tables, ACutOneTableCannotTakeIsDroppedOnEveryTable) {
  Tables tables;
  auto fine = std::make_unique<CountingTable>("fine", std::vector<wire::Opcode>{}, true);
  auto broken = std::make_unique<CountingTable>("broken", std::vector<wire::Opcode>{},
                                                Status::NotFound("chunk 3 is not here"));
  CountingTable* f = fine.get();
  ASSERT_TRUE(tables.Add(std::move(fine)).ok());
  ASSERT_TRUE(tables.Add(std::move(broken)).ok());
  CutRound round;
  auto behind = tables.BeginCut(&round);
  ASSERT_FALSE(behind.ok());
  EXPECT_EQ(behind.status().message(), "chunk 3 is not here");
  EXPECT_EQ(f->cuts_begun, 1);
  EXPECT_EQ(f->cuts_dropped, 1);
}

// A sync embedding table's step, fed in an order: (rank, ids, one value
// per row, end of step). What it applies, by id.
using Feed = std::vector<std::tuple<uint32_t, std::vector<int64_t>, std::vector<float>, bool>>;
std::map<int64_t, float> AppliedStep(SyncRowSteps& steps, const Feed& feed) {
  for (const auto& [rank, ids, grads, end] : feed) {
    auto held = steps.Hold(rank, 0, ids, grads.data(), end);
    EXPECT_TRUE(held.ok()) << held.status().ToString();
  }
  std::map<int64_t, float> applied;
  EXPECT_TRUE(steps.Ready());
  steps.ApplyNext([&](int64_t id, const float* g) { applied[id] = g[0]; });
  return applied;
}

// Sums are taken in rank order, whatever order the pushes arrived in: with
// values whose f32 sum depends on the order, two arrival orders give the
// same bits.
TEST(SyncRowSteps, ASumDoesNotDependOnArrivalOrder) {
  // Summed in arrival order, the reversed feed would give (1 - 1e8) + 1e8 = 0.
  const Feed ranks_in_order = {
      {0, {7}, {1e8f}, true}, {1, {7}, {-1e8f}, true}, {2, {7, 9}, {1.0f, 2.0f}, true}};
  const Feed reversed = {ranks_in_order[2], ranks_in_order[1], ranks_in_order[0]};
  SyncRowSteps a(3, 3, /*average=*/false, 1, 100), b(3, 3, false, 1, 100);
  const auto first = AppliedStep(a, ranks_in_order);
  const auto second = AppliedStep(b, reversed);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first.at(7), 1.0f);  // (1e8 - 1e8) + 1: rank 0, then 1, then 2
  EXPECT_EQ(first.at(9), 2.0f);
  EXPECT_EQ(a.applied_steps(), 1u);
}

TEST(SyncRowSteps, TheFirstWorkersToCompleteAreAveragedAndTheRestAreStale) {
  SyncRowSteps steps(2, 3, /*average=*/true, 1, 100);
  const float one = 1.0f, three = 3.0f, five = 5.0f;
  ASSERT_TRUE(steps.Hold(2, 4, std::vector<int64_t>{1}, &five, false).ok());
  ASSERT_TRUE(steps.Hold(1, 4, std::vector<int64_t>{1}, &three, true).ok());
  EXPECT_FALSE(steps.Ready());
  EXPECT_NE(steps.Missing(4).find("1 of the 2"), std::string::npos) << steps.Missing(4);
  ASSERT_TRUE(steps.Hold(0, 4, std::vector<int64_t>{1}, &one, true).ok());
  ASSERT_TRUE(steps.Ready());
  // Worker 2 completes after the step had its two: stale.
  EXPECT_EQ(*steps.Hold(2, 4, std::vector<int64_t>{}, nullptr, true), SyncRowSteps::Held::kStale);
  float got = 0;
  steps.ApplyNext([&](int64_t, const float* g) { got = g[0]; });
  EXPECT_EQ(got, 2.0f) << "(1 + 3) / 2: worker 2's 5 is not in it";
  EXPECT_EQ(steps.applied_steps(), 5u) << "the first push set the start step";
  EXPECT_EQ(*steps.Hold(0, 4, std::vector<int64_t>{1}, &one, true), SyncRowSteps::Held::kStale);
}

TEST(SyncRowSteps, RefusesWhatNoWorkerMaySend) {
  SyncRowSteps steps(1, 2, false, 1, /*max_rows=*/2);
  const float g[3] = {1, 1, 1};
  ASSERT_TRUE(steps.Hold(0, 0, std::vector<int64_t>{1}, g, false).ok());
  EXPECT_FALSE(steps.Hold(2, 0, std::vector<int64_t>{1}, g, true).ok()) << "rank 2 of 2 workers";
  auto ahead = steps.Hold(1, 2, std::vector<int64_t>{1}, g, true);
  ASSERT_FALSE(ahead.ok());
  EXPECT_NE(ahead.status().message().find("step 2 pushed while step 0"), std::string::npos);
  auto many = steps.Hold(0, 0, std::vector<int64_t>{2, 3}, g, true);
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(steps.Hold(0, 0, std::vector<int64_t>{2}, g, true).ok());
  EXPECT_EQ(*steps.Hold(0, 0, std::vector<int64_t>{2}, g, true), SyncRowSteps::Held::kDuplicate);
}

}  // namespace
}  // namespace tessera::server
