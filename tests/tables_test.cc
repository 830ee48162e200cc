// The shard's tables, without sockets: a request reaches the one table
// serving its opcode, no opcode is served twice, and a checkpoint round's
// cut is begun on every table and dropped on all of them when one cannot.
#include <gtest/gtest.h>

#include "server/tables.h"

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

}  // namespace
}  // namespace tessera::server
