// The parameter table and the apply state machine, without a socket: chunks
// created in a real table (host memory, arenas from a tcp context that never
// listens), then pushes applied by consistency mode as the shard applies them.
#include <gtest/gtest.h>

#include <cstring>

#include "server/apply.h"
#include "server/param_table.h"

namespace tessera::server {
namespace {

constexpr int kWorkers = 3;

class ApplyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::ContextOptions o;
    o.backend = "tcp";
    o.name = "apply_test";
    auto ctx = transport::Context::Open(o);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(*ctx);
    auto memory = ParamMemory::Open(MemorySpec{});
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    memory_ = std::move(*memory);
    table_ = std::make_unique<ParamTable>(ctx_.get(), memory_.get(), transport::MemoryKind::kHost,
                                          1u << 16, kWorkers);
  }

  // A 4-element f64 tensor of this rule and mode, as one chunk.
  Param& Create(const std::string& name, UpdateRule rule, ConsistencyMode mode) {
    wire::CreateEntry e;
    e.tensor.name = name;
    e.tensor.dtype = DType::kF64;
    e.tensor.shape = {4};
    e.tensor.rule = rule;
    e.tensor.hyper.learning_rate = 0.5f;
    e.tensor.mode = mode;
    e.elem_count = 4;
    auto p = table_->Create(e);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return **p;
  }
  static std::vector<double> Values(const Param& p) {
    std::vector<double> v(4);
    std::memcpy(v.data(), p.data, 32);
    return v;
  }
  // As the shard builds it: host memory, not staged.
  apply::Target target() { return {memory_.get(), false, nullptr, memory_->is_host()}; }

  std::unique_ptr<transport::Context> ctx_;
  std::unique_ptr<ParamMemory> memory_;
  std::unique_ptr<ParamTable> table_;
  const std::vector<double> ones_ = std::vector<double>(4, 1.0);
  const std::vector<double> twos_ = std::vector<double>(4, 2.0);
};

TEST_F(ApplyTest, TableCreatesOnceAndRefusesAnotherShape) {
  Param& p = Create("w", UpdateRule::kAdd, ConsistencyMode::Async());
  EXPECT_EQ(&Create("w", UpdateRule::kAdd, ConsistencyMode::Async()), &p) << "created twice";
  EXPECT_EQ(table_->Find(p.key_id), &p);
  EXPECT_EQ(table_->Find("w", 0), &p);
  EXPECT_EQ(table_->Find("w", 1), nullptr);
  EXPECT_EQ(Values(p), std::vector<double>(4, 0.0)) << "a new chunk is zeroed";
  EXPECT_EQ(p.arena_offset % 64, 0u);

  wire::CreateEntry other = p.entry;
  other.tensor.shape = {2, 2};
  auto refused = table_->Create(other);
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("'w'"), std::string::npos);
  EXPECT_EQ(table_->size(), 1u);
}

TEST_F(ApplyTest, AsyncAppliesEachPushAndCountsVersions) {
  Param& p = Create("w", UpdateRule::kAdd, ConsistencyMode::Async());
  ASSERT_TRUE(apply::Init(target(), p, twos_.data(), 0).ok());
  EXPECT_TRUE(p.initialized);
  EXPECT_EQ(p.version, 1u);
  ASSERT_TRUE(apply::Gradient(target(), p, ones_.data()).ok());
  ASSERT_TRUE(apply::Gradient(target(), p, ones_.data()).ok());
  EXPECT_EQ(Values(p), std::vector<double>(4, 4.0));
  EXPECT_EQ(p.version, 3u);
  EXPECT_EQ(p.StepReached(), 2u);
}

// The shard's path for a batch of small host chunks: a plain rule applied
// with no Status, as Gradient applies it, and only where Gradient could not
// have failed or had more to do (an optimizer, a staged copy to follow).
TEST_F(ApplyTest, APlainGradientIsTheGradient) {
  Param& add = Create("a", UpdateRule::kAdd, ConsistencyMode::Async());
  Param& add_twin = Create("a2", UpdateRule::kAdd, ConsistencyMode::Async());
  Param& assign = Create("s", UpdateRule::kAssign, ConsistencyMode::Bounded(1, kWorkers));
  Param& momentum = Create("m", UpdateRule::kMomentum, ConsistencyMode::Async());
  for (Param* p : {&add, &add_twin, &assign, &momentum}) {
    ASSERT_TRUE(apply::Init(target(), *p, twos_.data(), 0).ok());
  }
  ASSERT_TRUE(apply::TakesPlainGradient(target(), add));
  ASSERT_TRUE(apply::TakesPlainGradient(target(), assign));
  EXPECT_FALSE(apply::TakesPlainGradient(target(), momentum)) << "an optimizer has state";
  apply::Target staged = target();
  staged.staged = true;
  EXPECT_FALSE(apply::TakesPlainGradient(staged, add)) << "a staged copy must follow";

  const std::vector<double> grad = {1.0, -2.0, 0.5, 3.0};
  apply::PlainGradient(add, grad.data());
  ASSERT_TRUE(apply::Gradient(target(), add_twin, grad.data()).ok());
  EXPECT_EQ(Values(add), Values(add_twin));
  EXPECT_EQ(Values(add), (std::vector<double>{3.0, 0.0, 2.5, 5.0}));
  EXPECT_EQ(add.version, add_twin.version);
  EXPECT_EQ(add.version, 2u);
  apply::PlainGradient(assign, grad.data());
  EXPECT_EQ(Values(assign), grad);
  EXPECT_EQ(assign.version, 2u);
}

TEST_F(ApplyTest, InitStartsTheOptimizerAfresh) {
  Param& p = Create("m", UpdateRule::kMomentum, ConsistencyMode::Async());
  p.hyper.momentum = 0.5f;
  ASSERT_TRUE(apply::Init(target(), p, twos_.data(), 0).ok());
  ASSERT_TRUE(apply::Gradient(target(), p, ones_.data()).ok());  // 2 - 0.5 * 1
  EXPECT_EQ(Values(p), std::vector<double>(4, 1.5));
  EXPECT_EQ(p.updates, 1u);
  ASSERT_TRUE(apply::Init(target(), p, twos_.data(), 0).ok());
  EXPECT_EQ(p.updates, 0u);
  ASSERT_TRUE(apply::Gradient(target(), p, ones_.data()).ok());
  EXPECT_EQ(Values(p), std::vector<double>(4, 1.5)) << "the momentum survived the init";
}

TEST_F(ApplyTest, SyncStepAppliesOnceItsReplicasPushed) {
  Param& p = Create("s", UpdateRule::kAdd, ConsistencyMode::Sync(2, kWorkers, false));
  ASSERT_TRUE(apply::Init(target(), p, ones_.data(), 0).ok());
  auto first = apply::AddToSyncStep(target(), p, 0, 0, twos_.data());
  ASSERT_TRUE(first.status.ok());
  EXPECT_EQ(first.outcome, wire::PushOutcome::kApplied);
  EXPECT_FALSE(first.step_ready);
  EXPECT_EQ(apply::AddToSyncStep(target(), p, 0, 0, twos_.data()).outcome,
            wire::PushOutcome::kDuplicate);
  auto second = apply::AddToSyncStep(target(), p, 1, 0, ones_.data());
  EXPECT_TRUE(second.step_ready);
  EXPECT_EQ(Values(p), ones_) << "a step applies only when the shard applies it";
  // The step has its replicas: the third worker is a backup, dropped.
  EXPECT_EQ(apply::AddToSyncStep(target(), p, 2, 0, ones_.data()).outcome,
            wire::PushOutcome::kStale);
  ASSERT_TRUE(apply::ApplySyncStep(target(), p).ok());
  EXPECT_EQ(Values(p), std::vector<double>(4, 4.0));  // 1 + 2 + 1
  EXPECT_EQ(p.step, 1u);
  EXPECT_EQ(p.StepReached(), 1u);
  EXPECT_EQ(apply::AddToSyncStep(target(), p, 2, 0, ones_.data()).outcome,
            wire::PushOutcome::kStale)
      << "a late push of an applied step";
  EXPECT_FALSE(apply::AddToSyncStep(target(), p, 2, 1, ones_.data()).step_ready);
}

TEST_F(ApplyTest, SyncAverageScalesTheSum) {
  Param& p = Create("a", UpdateRule::kAdd, ConsistencyMode::Sync(2, 2, true));
  ASSERT_TRUE(apply::Init(target(), p, ones_.data(), 0).ok());
  apply::AddToSyncStep(target(), p, 0, 0, ones_.data());
  ASSERT_TRUE(apply::AddToSyncStep(target(), p, 1, 0, twos_.data()).step_ready);
  ASSERT_TRUE(apply::ApplySyncStep(target(), p).ok());
  EXPECT_EQ(Values(p), std::vector<double>(4, 2.5));  // 1 + (1 + 2) / 2
}

TEST_F(ApplyTest, AFailedSyncStepStillMovesOnAndKeepsTheValue) {
  Param& p = Create("f", UpdateRule::kAdd, ConsistencyMode::Sync(1, kWorkers, false));
  ASSERT_TRUE(apply::Init(target(), p, ones_.data(), 0).ok());
  ASSERT_TRUE(apply::AddToSyncStep(target(), p, 0, 0, twos_.data()).step_ready);
  Status st = apply::ApplySyncStep(target(), p, Status::Internal("injected"));
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(Values(p), ones_);
  EXPECT_EQ(p.step, 1u);
  EXPECT_EQ(p.agg_count, 0u);
  EXPECT_TRUE(apply::AddToSyncStep(target(), p, 0, 1, twos_.data()).step_ready);
}

// A sync or bounded tensor declared once training is under way starts at the
// global step the chief initialised it at, where the workers' pushes are.
TEST_F(ApplyTest, InitStartsSteppedTensorsAtTheClusterStep) {
  Param& sync = Create("late_sync", UpdateRule::kAdd, ConsistencyMode::Sync(1, kWorkers, false));
  ASSERT_TRUE(apply::Init(target(), sync, ones_.data(), 7).ok());
  EXPECT_EQ(sync.StepReached(), 7u);
  EXPECT_EQ(apply::AddToSyncStep(target(), sync, 0, 6, twos_.data()).outcome,
            wire::PushOutcome::kStale);
  EXPECT_TRUE(apply::AddToSyncStep(target(), sync, 0, 7, twos_.data()).step_ready);
  Param& bounded = Create("late_bounded", UpdateRule::kAdd, ConsistencyMode::Bounded(1, kWorkers));
  ASSERT_TRUE(apply::Init(target(), bounded, ones_.data(), 7).ok());
  EXPECT_EQ(bounded.StepReached(), 7u);
  // Initialised again (after a failed step) at an older step: never back.
  ASSERT_TRUE(apply::Init(target(), bounded, ones_.data(), 3).ok());
  EXPECT_EQ(bounded.StepReached(), 7u);
}

TEST_F(ApplyTest, BoundedRecordsEachWorkersSteps) {
  Param& p = Create("b", UpdateRule::kAdd, ConsistencyMode::Bounded(2, kWorkers));
  ASSERT_TRUE(apply::Init(target(), p, ones_.data(), 0).ok());
  for (uint32_t rank = 0; rank < kWorkers; ++rank) {
    ASSERT_TRUE(apply::Gradient(target(), p, ones_.data()).ok());
    apply::NoteBoundedStep(p, rank, rank == 2 ? 0 : 4);
  }
  EXPECT_EQ(p.StepReached(), 1u) << "the slowest worker pushed one step";
  apply::NoteBoundedStep(p, 2, 1);
  EXPECT_EQ(p.StepReached(), 2u);
  apply::NoteBoundedStep(p, 2, 0);
  EXPECT_EQ(p.StepReached(), 2u) << "a late push does not move a worker back";
  apply::NoteBoundedStep(p, kWorkers, 9);  // a rank the chunk does not have: ignored
  EXPECT_EQ(Values(p), std::vector<double>(4, 4.0));
}

TEST_F(ApplyTest, StagedValuesArePublishedAfterEveryChange) {
  Param& p = Create("h", UpdateRule::kAdd, ConsistencyMode::Async());
  // Host memory has no separate copy; point `published` at one to see the
  // staging path do its copy.
  std::vector<double> host(4, -1.0);
  p.published = reinterpret_cast<uint8_t*>(host.data());
  std::atomic<uint64_t> staged{0};
  const apply::Target staged_target{memory_.get(), true, &staged};
  ASSERT_TRUE(apply::Init(staged_target, p, twos_.data(), 0).ok());
  EXPECT_EQ(host, twos_);
  ASSERT_TRUE(apply::Gradient(staged_target, p, ones_.data()).ok());
  EXPECT_EQ(host, std::vector<double>(4, 3.0));
  EXPECT_EQ(staged.load(), 64u);
}

}  // namespace
}  // namespace tessera::server
