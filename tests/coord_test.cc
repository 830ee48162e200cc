// The coordinator's step count and the shard's step counter, without a
// socket: the global step from the reports of the ps tasks.
#include <gtest/gtest.h>

#include "coord/coordinator.h"
#include "coord/table_registry.h"
#include "server/step_counter.h"

namespace tessera {
namespace {

wire::Declare OneTensor(const std::string& name, ConsistencyMode mode) {
  wire::Declare d;
  d.chunk_bytes = 1u << 20;
  wire::TensorDecl t;
  t.name = name;
  t.dtype = DType::kF32;
  t.shape = {4};
  t.rule = UpdateRule::kAdd;
  t.mode = mode;
  d.tensors.push_back(t);
  return d;
}

TEST(CoordinatorSteps, AsyncStepsAddUp) {
  coord::Coordinator c(2, 3);
  ASSERT_TRUE(c.Declare(OneTensor("w", ConsistencyMode::Async()), "worker 0", true).ok());
  ASSERT_TRUE(c.OnStepsApplied(0, {.async_steps = 4}).ok());
  ASSERT_TRUE(c.OnStepsApplied(1, {.async_steps = 3}).ok());
  EXPECT_EQ(c.global_step(), 7u);
  EXPECT_EQ(c.step_reports_by_shard(), (std::vector<uint64_t>{1, 1}));
}

TEST(CoordinatorSteps, SyncStepCountsOnceItsReplicasFinished) {
  coord::Coordinator c(2, 3);
  ASSERT_TRUE(c.Declare(OneTensor("w", ConsistencyMode::Sync(3, 3, false)), "w0", true).ok());
  // Two workers' steps lie on ps 0 alone; the third pushed to ps 1 alone.
  ASSERT_TRUE(c.OnStepsApplied(0, {.sync_step = 0, .sync_workers = {{0, 1}, {1, 1}}}).ok());
  EXPECT_EQ(c.global_step(), 0u);
  ASSERT_TRUE(c.OnStepsApplied(1, {.sync_step = 0, .sync_workers = {{2, 1}}}).ok());
  EXPECT_EQ(c.global_step(), 1u);
  // A late report of a counted step changes nothing.
  ASSERT_TRUE(c.OnStepsApplied(1, {.sync_step = 0, .sync_workers = {{0, 1}}}).ok());
  EXPECT_EQ(c.global_step(), 1u);
  ASSERT_TRUE(c.OnStepsApplied(0, {.sync_step = 1, .sync_workers = {{2, 1}, {0, 1}, {1, 1}}}).ok());
  EXPECT_EQ(c.global_step(), 2u);
}

// A worker's step over two shards is done once both counted it: a part lost
// with a shard holds the step back, so a restarted shard resumes there.
TEST(CoordinatorSteps, AStepOverTwoShardsWaitsForBoth) {
  coord::Coordinator c(2, 1);
  ASSERT_TRUE(c.Declare(OneTensor("w", ConsistencyMode::Sync(1, 1, false)), "w0", true).ok());
  ASSERT_TRUE(c.OnStepsApplied(0, {.sync_step = 0, .sync_workers = {{0, 2}}}).ok());
  EXPECT_EQ(c.global_step(), 0u);
  ASSERT_TRUE(c.OnStepsApplied(0, {.sync_step = 0, .sync_workers = {{0, 2}}}).ok());
  EXPECT_EQ(c.global_step(), 0u) << "the same shard twice is still one part";
  ASSERT_TRUE(c.OnStepsApplied(1, {.sync_step = 0, .sync_workers = {{0, 2}}}).ok());
  EXPECT_EQ(c.global_step(), 1u);
}

TEST(CoordinatorSteps, RefusesReportsNamingStrangers) {
  coord::Coordinator c(2, 3);
  ASSERT_TRUE(c.Declare(OneTensor("w", ConsistencyMode::Sync(3, 3, false)), "w0", true).ok());
  Status st = c.OnStepsApplied(0, {.sync_step = 0, .sync_workers = {{3, 1}}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("worker rank 3"), std::string::npos) << st.message();
  EXPECT_FALSE(c.OnStepsApplied(0, {.sync_step = 0, .sync_workers = {{0, 3}}}).ok())
      << "a step over 3 shards of 2";
  EXPECT_FALSE(c.OnStepsApplied(0, {.sync_step = 0, .sync_workers = {{0, 0}}}).ok());
  EXPECT_FALSE(c.OnStepsApplied(2, {.async_steps = 1}).ok()) << "no ps task 2";
  EXPECT_FALSE(c.OnStepsApplied(-1, {.async_steps = 1}).ok());
  EXPECT_EQ(c.global_step(), 0u);
}

// A coordinator that restarted learns from a joining task how far its sync
// chunks got: the step before the furthest one is complete everywhere (a
// worker pushes step s only after pulling s - 1 from every shard).
TEST(CoordinatorSteps, AJoiningTasksFurthestSyncChunkBoundsTheGlobalStep) {
  coord::Coordinator c(2, 1);
  ASSERT_TRUE(c.Declare(OneTensor("w", ConsistencyMode::Sync(1, 1, false)), "w0", true).ok());
  c.NoteSyncStepReached(9);
  EXPECT_EQ(c.global_step(), 8u);
  c.NoteSyncStepReached(3);
  EXPECT_EQ(c.global_step(), 8u) << "a task that is behind moves nothing back";
  ASSERT_TRUE(c.OnStepsApplied(1, {.sync_step = 7, .sync_workers = {{0, 2}}}).ok());
  EXPECT_EQ(c.global_step(), 8u) << "a report of a step already counted";
  ASSERT_TRUE(c.OnStepsApplied(0, {.sync_step = 8, .sync_workers = {{0, 2}}}).ok());
  ASSERT_TRUE(c.OnStepsApplied(1, {.sync_step = 8, .sync_workers = {{0, 2}}}).ok());
  EXPECT_EQ(c.global_step(), 9u);
}

TEST(CoordinatorHyper, DeclaresReturnWhatTheChiefSetSince) {
  coord::Coordinator c(1, 2);
  ASSERT_TRUE(c.Declare(OneTensor("w", ConsistencyMode::Async()), "w0", true).ok());
  Hyperparams h;
  h.learning_rate = 0.25f;
  ASSERT_TRUE(c.UpdateHyper({"w", h}).ok());
  auto again = c.Declare(OneTensor("w", ConsistencyMode::Async()), "w1", false);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->hyper.size(), 1u);
  EXPECT_EQ(again->hyper[0].learning_rate, 0.25f);
  EXPECT_EQ(c.UpdateHyper({"nope", h}).code(), StatusCode::kNotFound);
  h.learning_rate = -1.0f;
  EXPECT_FALSE(c.UpdateHyper({"w", h}).ok()) << "a negative learning rate";
}

TEST(StepCounter, ReportsASyncStepOnceItsReplicasFinished) {
  server::StepCounter counter;
  counter.CountSync(1, 0, 3, 2);
  counter.CountSync(0, 0, 3, 2);
  counter.CountSync(0, 0, 3, 2);  // a duplicate
  EXPECT_FALSE(counter.has_reports());
  counter.CountSync(2, 0, 3, 1);
  auto reports = counter.TakeReports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], (wire::StepsApplied{0, 0, {{1, 2}, {0, 2}, {2, 1}}}));
  counter.CountSync(1, 0, 3, 2);  // a backup worker, late
  EXPECT_FALSE(counter.has_reports());
}

TEST(StepCounter, ALaterStepFlushesAnEarlierOneThatCannotGrow) {
  server::StepCounter counter;
  counter.CountSync(0, 4, 2, 1);
  EXPECT_FALSE(counter.has_reports());
  counter.CountSync(0, 5, 2, 1);  // step 4's other worker counted it elsewhere
  counter.CountAsync();
  counter.CountAsync();
  auto reports = counter.TakeReports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], (wire::StepsApplied{2, 4, {{0, 1}}})) << "the async steps ride the first";
  counter.CountSync(1, 5, 2, 1);
  reports = counter.TakeReports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], (wire::StepsApplied{0, 5, {{0, 1}, {1, 1}}}));
  EXPECT_TRUE(counter.TakeReports().empty());
}

// Reports wait while the coordinator is unreachable, but not without bound:
// the newest steps are kept, and they supersede the older ones.
TEST(StepCounter, WaitingReportsAreBounded) {
  server::StepCounter counter;
  for (uint64_t step = 0; step < 1000; ++step) counter.CountSync(0, step, 1, 1);
  auto reports = counter.TakeReports();
  ASSERT_EQ(reports.size(), 256u);
  EXPECT_EQ(reports.back().sync_step, 999u);
}

TEST(StepCounter, AsyncStepsTravelAsOneCount) {
  server::StepCounter counter;
  for (int i = 0; i < 5; ++i) counter.CountAsync();
  auto reports = counter.TakeReports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], (wire::StepsApplied{5, 0, {}}));
}

wire::EmbeddingDecl Table(const std::string& name, uint32_t dim) {
  wire::EmbeddingDecl t;
  t.name = name;
  t.dim = dim;
  t.max_rows_per_shard = 100;
  return t;
}

TEST(TableRegistry, IdsFollowFirstDeclarationsAndTheFirstHyperParametersStay) {
  coord::TableRegistry tables;
  auto user = tables.Declare(Table("user", 8), "/job:worker/task:0");
  ASSERT_TRUE(user.ok());
  EXPECT_EQ(user->table_id, 1u);
  auto item = tables.Declare(Table("item", 16), "/job:worker/task:0");
  ASSERT_TRUE(item.ok());
  EXPECT_EQ(item->table_id, 2u);
  wire::EmbeddingDecl again = Table("user", 8);
  again.hyper.learning_rate = 0.5f;
  auto user2 = tables.Declare(again, "/job:worker/task:1");
  ASSERT_TRUE(user2.ok());
  EXPECT_EQ(user2->table_id, 1u);
  EXPECT_EQ(user2->table.hyper.learning_rate, Table("user", 8).hyper.learning_rate);
  EXPECT_EQ(tables.size(), 2u);
}

TEST(TableRegistry, ADeclarationThatDisagreesIsRefusedNamingTheFieldAndBothTasks) {
  coord::TableRegistry tables;
  ASSERT_TRUE(tables.Declare(Table("user", 8), "/job:worker/task:0").ok());
  auto wider = tables.Declare(Table("user", 9), "/job:worker/task:1");
  ASSERT_FALSE(wider.ok());
  const std::string& why = wider.status().message();
  EXPECT_NE(why.find("'user'"), std::string::npos) << why;
  EXPECT_NE(why.find("another dim"), std::string::npos) << why;
  EXPECT_NE(why.find("/job:worker/task:0"), std::string::npos) << why;
  EXPECT_NE(why.find("/job:worker/task:1"), std::string::npos) << why;
  wire::EmbeddingDecl seeded = Table("user", 8);
  seeded.initializer.seed = 5;
  auto other_seed = tables.Declare(seeded, "/job:worker/task:1");
  ASSERT_FALSE(other_seed.ok());
  EXPECT_NE(other_seed.status().message().find("initializer"), std::string::npos);
}

TEST(TableRegistry, HoldsAtMostItsLimitOfTables) {
  coord::TableRegistry tables;
  for (size_t i = 0; i < coord::TableRegistry::kMaxTables; ++i) {
    ASSERT_TRUE(tables.Declare(Table("t" + std::to_string(i), 4), "w").ok());
  }
  auto over = tables.Declare(Table("one-more", 4), "w");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(tables.Declare(Table("t0", 4), "w").ok()) << "a declared table is still found";
}

}  // namespace
}  // namespace tessera
