// Embedding tables through a cluster (issue 45), over every transport:
// rows pulled and pushed by id across two ps tasks, as each worker sees
// them, and every refusal named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/row_placement.h"
#include "embed/row_initializer.h"
#include "tessera/client.h"
#include "tests/cluster_fixture.h"
#include "wire/row_messages.h"

namespace tessera {
namespace {

using testing::ClusterTest;
using testing::RawPeer;

EmbeddingSpec SgdTable(const std::string& name, uint32_t dim) {
  EmbeddingSpec spec;
  spec.name = name;
  spec.dim = dim;
  spec.rule = UpdateRule::kSgd;
  spec.hyper.learning_rate = 0.5f;
  spec.hyper.weight_decay = 0.0f;
  spec.initializer = Initializer::Uniform(-1.0, 1.0, 3);
  return spec;
}

std::vector<float> InitialRow(const EmbeddingSpec& spec, int64_t id) {
  auto init = embed::RowInitializer::Make(spec.initializer, spec.dtype, spec.dim, spec.name);
  EXPECT_TRUE(init.ok());
  std::vector<float> row(spec.dim);
  init->Fill(id, row.data());
  return row;
}

// Ids from every corner of int64, some repeated, spread over both ps tasks:
// a pull reads each id's initial value until it is pushed, then exactly
// value - lr * (the sum of its gradients), whichever worker reads it.
TEST_P(ClusterTest, EmbeddingRowsArePulledAndPushedByIdOverTwoPsTasks) {
  StartCluster(2, 2);
  Client& w0 = Connect(0);
  Client& w1 = Connect(1);
  const EmbeddingSpec spec = SgdTable("user", 8);
  auto t0 = w0.DeclareEmbedding(spec);
  ASSERT_TRUE(t0.ok()) << t0.status().ToString();
  auto t1 = w1.DeclareEmbedding(spec);
  ASSERT_TRUE(t1.ok()) << t1.status().ToString();
  EXPECT_EQ(t0->dim, 8u);

  const std::vector<int64_t> ids = {7,         std::numeric_limits<int64_t>::min(), -3,        7,
                                    1LL << 50, std::numeric_limits<int64_t>::max(), 123456789, -3};
  std::vector<float> rows(ids.size() * 8);
  ASSERT_TRUE(w1.PullRows(*t1, ids, rows.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto want = InitialRow(spec, ids[i]);
    ASSERT_EQ(std::memcmp(rows.data() + i * 8, want.data(), 32), 0) << "id " << ids[i];
  }

  // Row i of the gradient is i + j/8 at element j; 7 and -3 get two rows each.
  std::vector<float> grads(ids.size() * 8);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t j = 0; j < 8; ++j) grads[i * 8 + j] = static_cast<float>(i) + j / 8.0f;
  }
  ASSERT_TRUE(w0.PushRows(*t0, ids, grads.data()).ok());
  ASSERT_TRUE(w1.PullRows(*t1, ids, rows.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> sum(8, 0.0f);
    bool first = true;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] != ids[i]) continue;
      for (size_t j = 0; j < 8; ++j) sum[j] = first ? grads[k * 8 + j] : sum[j] + grads[k * 8 + j];
      first = false;
    }
    const auto initial = InitialRow(spec, ids[i]);
    for (size_t j = 0; j < 8; ++j) {
      const float want = initial[j] - 0.5f * sum[j];
      ASSERT_EQ(rows[i * 8 + j], want) << "id " << ids[i] << " element " << j;
    }
  }
}

TEST_P(ClusterTest, AnEmbeddingTableDeclaredOtherwiseIsRefusedByName) {
  StartCluster(2, 2);
  Client& w0 = Connect(0);
  Client& w1 = Connect(1);
  ASSERT_TRUE(w0.DeclareEmbedding(SgdTable("item", 8)).ok());
  auto wider = w1.DeclareEmbedding(SgdTable("item", 16));
  ASSERT_FALSE(wider.ok());
  const std::string& why = wider.status().message();
  EXPECT_NE(why.find("'item'"), std::string::npos) << why;
  EXPECT_NE(why.find("another dim"), std::string::npos) << why;
  EXPECT_NE(why.find("/job:worker/task:0"), std::string::npos) << why;
  // Bounded tables are not served yet: said, not taken for async.
  EmbeddingSpec bounded = SgdTable("clicks", 4);
  bounded.mode = ConsistencyMode::Bounded(2);
  auto refused = w0.DeclareEmbedding(bounded);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("bounded embedding tables are not served yet"),
            std::string::npos)
      << refused.status().ToString();
  EmbeddingSpec glorot = SgdTable("glorot", 4);
  glorot.initializer = Initializer::GlorotUniform();
  auto no_shape = w0.DeclareEmbedding(glorot);
  ASSERT_FALSE(no_shape.ok());
  EXPECT_NE(no_shape.status().message().find("Glorot"), std::string::npos);
}

TEST_P(ClusterTest, BadRowCallsAreNamedAndTheTableGoesOn) {
  StartCluster(2, 1);
  Client& w = Connect(0);
  EmbeddingSpec spec = SgdTable("ads", 4);
  spec.max_rows_per_shard = 3;
  auto t = w.DeclareEmbedding(spec);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<float> rows(4 * 4);

  Embedding edited = *t;
  edited.dim = 5;
  auto wrong_dim = w.PullRows(edited, std::vector<int64_t>{1}, rows.data());
  ASSERT_FALSE(wrong_dim.ok());
  EXPECT_NE(wrong_dim.message().find("dim 4"), std::string::npos) << wrong_dim.ToString();
  Embedding foreign = *t;
  foreign.client = t->client + 1000;
  EXPECT_FALSE(w.PullRows(foreign, std::vector<int64_t>{1}, rows.data()).ok());

  // A NaN row is not applied, and the call says so; the finite one is.
  const std::vector<int64_t> two = {10, 11};
  std::vector<float> grads(8, 1.0f);
  grads[5] = std::numeric_limits<float>::quiet_NaN();
  auto nan = w.PushRows(*t, two, grads.data());
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.message().find("NaN or an Inf"), std::string::npos) << nan.ToString();
  ASSERT_TRUE(w.PullRows(*t, two, rows.data()).ok());
  const auto init10 = InitialRow(spec, 10), init11 = InitialRow(spec, 11);
  EXPECT_EQ(rows[0], init10[0] - 0.5f);
  EXPECT_EQ(rows[4], init11[0]) << "the NaN row stayed as it was";

  // More rows than a ps task may hold: refused whole, nothing made.
  std::vector<int64_t> many;
  for (int64_t id = 100; id < 120; ++id) many.push_back(id);
  std::vector<float> many_grads(many.size() * 4, 1.0f);
  auto full = w.PushRows(*t, many, many_grads.data());
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("max_rows_per_shard"), std::string::npos) << full.ToString();
  std::vector<float> after(many.size() * 4);
  ASSERT_TRUE(w.PullRows(*t, many, after.data()).ok());
  for (size_t i = 0; i < many.size(); ++i) {
    EXPECT_EQ(after[i * 4], InitialRow(spec, many[i])[0]) << "id " << many[i] << " was touched";
  }
  // And the table still takes what fits.
  EXPECT_TRUE(w.PushRows(*t, std::vector<int64_t>{10}, grads.data()).ok());
}

// What a Client never sends, from an authenticated worker: each refused by
// name, and the shard serves the table on as before.
TEST_P(ClusterTest, RowMessagesAClientNeverSendsAreRefusedByName) {
  StartCluster(2, 2);
  Client& w = Connect(0);
  const EmbeddingSpec spec = SgdTable("user", 4);
  auto t = w.DeclareEmbedding(spec);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(1))).ok());
  auto refusal = [&](auto msg, uint64_t id) {
    raw.Send(msg, id);
    auto err = wire::Decode<wire::Error>(raw.Next());
    return err.ok() ? err->message : std::string("no error: ") + err.status().ToString();
  };
  // The coordinator gave "user" id 1.
  int64_t elsewhere = 0;
  while (RowPlacement(2).ShardOf(elsewhere) != 1) ++elsewhere;
  EXPECT_NE(refusal(wire::RowsPull{1, 0, 0, {elsewhere}}, 3).find("ps task 1's, not ps task 0's"),
            std::string::npos);
  EXPECT_NE(refusal(wire::RowsPull{9, 0, 0, {1}}, 4).find("no embedding table has id 9"),
            std::string::npos);
  int64_t here = 0;
  while (RowPlacement(2).ShardOf(here) != 0) ++here;
  EXPECT_NE(refusal(wire::RowsPush{1, 0, false, {here}, std::vector<uint8_t>(12)}, 5)
                .find("12 bytes of gradients for 1 ids"),
            std::string::npos);
  wire::EmbeddingDecl other;
  other.name = "item";
  other.dim = 4;
  other.initializer = Initializer::Uniform(-1, 1);
  other.max_rows_per_shard = 10;
  EXPECT_NE(refusal(wire::CreateTable{1, other}, 6).find("table id 1 is embedding table 'user'"),
            std::string::npos);
  // The table is served on.
  std::vector<float> row(4);
  ASSERT_TRUE(w.PullRows(*t, std::vector<int64_t>{here}, row.data()).ok());
  EXPECT_EQ(row, InitialRow(spec, here));
}

// A sync table: each worker's rows of a step held until both completed it,
// then summed per id in rank order, averaged, and applied once per row; a
// row nobody touched stays; a pull of the next step waits for it, and one
// whose step never completes says who has not.
TEST_P(ClusterTest, SyncEmbeddingStepsApplyOnceBothWorkersCompletedThem) {
  StartCluster(2, 2);
  ClientOptions short_wait = Options(0);
  short_wait.op_timeout = std::chrono::seconds(2);
  Client& w0 = Connect(short_wait);
  Client& w1 = Connect(1);
  EmbeddingSpec spec = SgdTable("sync_rows", 4);
  spec.mode = ConsistencyMode::Sync(2, 2);  // averaged
  auto t0 = w0.DeclareEmbedding(spec);
  auto t1 = w1.DeclareEmbedding(spec);
  ASSERT_TRUE(t0.ok() && t1.ok()) << t0.status().ToString() << t1.status().ToString();

  const std::vector<int64_t> ids0 = {1, 2}, ids1 = {2, 3};
  const std::vector<float> g0 = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> g1 = {0.5f, 0.25f, 0.125f, 1, 9, 10, 11, 12};
  ASSERT_TRUE(w0.PushRows(*t0, ids0, g0.data(), {.step = 0}).ok());
  const std::vector<int64_t> all = {1, 2, 3, 4};
  std::vector<float> rows(16);
  Future waiting = w0.PullRowsAsync(*t0, all, rows.data(), /*min_step=*/1);
  EXPECT_FALSE(waiting.ready()) << "step 0 cannot apply before worker 1 completed it";
  ASSERT_TRUE(w1.PushRows(*t1, ids1, g1.data(), {.step = 0}).ok());
  ASSERT_TRUE(waiting.Wait().ok()) << waiting.Wait().ToString();

  auto want = [&](int64_t id, size_t j, float g) {
    return InitialRow(spec, id)[j] - 0.5f * (g * 0.5f);
  };
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(rows[0 * 4 + j], want(1, j, g0[j])) << "id 1, " << j;
    EXPECT_EQ(rows[1 * 4 + j], want(2, j, g0[4 + j] + g1[j])) << "id 2, " << j;
    EXPECT_EQ(rows[2 * 4 + j], want(3, j, g1[4 + j])) << "id 3, " << j;
    EXPECT_EQ(rows[3 * 4 + j], InitialRow(spec, 4)[j]) << "id 4 was touched by nobody";
  }
  // A second push of an applied step is stale: dropped, nothing moves.
  ASSERT_TRUE(w1.PushRows(*t1, ids1, g1.data(), {.step = 0}).ok());
  std::vector<float> again(16);
  ASSERT_TRUE(w1.PullRows(*t1, all, again.data(), 1).ok());
  EXPECT_EQ(again, rows);
  // A sync push needs its step.
  auto no_step = w0.PushRows(*t0, ids0, g0.data());
  ASSERT_FALSE(no_step.ok());
  EXPECT_NE(no_step.message().find("needs its step"), std::string::npos);
  // Worker 0 completes step 1, worker 1 never does: the pull of step 2
  // says so (within worker 0's wait, its op timeout less a fifth).
  ASSERT_TRUE(w0.PushRows(*t0, std::vector<int64_t>{}, nullptr, {.step = 1}).ok());
  auto stuck = w0.PullRows(*t0, all, rows.data(), 2);
  ASSERT_FALSE(stuck.ok());
  EXPECT_EQ(stuck.code(), StatusCode::kDeadlineExceeded) << stuck.ToString();
  EXPECT_NE(stuck.message().find("not complete from worker 1"), std::string::npos)
      << stuck.ToString();
}

// Pulls that wait for a step are bounded: a worker asking for a step far
// ahead, without a deadline, again and again, is refused past the bound.
TEST_P(ClusterTest, RowsPullsWaitingForAStepAreBounded) {
  StartCluster(1, 2);
  Client& w = Connect(0);
  EmbeddingSpec spec = SgdTable("sync_bound", 4);
  spec.mode = ConsistencyMode::Sync(2, 2);
  auto t = w.DeclareEmbedding(spec);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(w.PushRows(*t, std::vector<int64_t>{}, nullptr, {.step = 0}).ok());  // starts it
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(1))).ok());
  for (uint64_t i = 0; i <= 4096; ++i) raw.Send(wire::RowsPull{1, 1000, 0, {5}}, 10 + i);
  auto err = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(err.ok()) << err.status().ToString();
  EXPECT_NE(err->message.find("rows-pulls waiting"), std::string::npos) << err->message;
}

}  // namespace
}  // namespace tessera
