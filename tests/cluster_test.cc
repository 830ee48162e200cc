// Shards and workers in one process (separate transport contexts, real
// connections), by topic across cluster_*_test.cc; this file: the chief's
// initialisation and placement, and the instantiation over every transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/secret.h"
#include "core/timeouts.h"
#include "kernels/update.h"
#include "tessera/client.h"
#include "tessera/server.h"
#include "tests/cluster_fixture.h"
#include "tests/test_util.h"
#include "tools/cpu_hog.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

using testing::ClusterTest;
using testing::RawPeer;
using testing::ShardProcesses;

TEST_P(ClusterTest, ChiefInitialisesOthersWaitAndSeeIt) {
  StartCluster(2, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  auto spec = F32("w", 3);
  std::vector<float> init = {1.5f, -2.0f, 3.25f};
  spec.initial.resize(12);
  std::memcpy(spec.initial.data(), init.data(), 12);
  auto w0 = chief.Declare(spec);
  auto w1 = other.Declare(F32("w", 3));
  ASSERT_TRUE(w0.ok() && w1.ok());
  EXPECT_TRUE(chief.is_chief());
  EXPECT_FALSE(other.is_chief());
  EXPECT_EQ(other.Initialize().code(), StatusCode::kFailedPrecondition);

  std::thread waiter([&] { EXPECT_TRUE(other.WaitForInit(10s).ok()); });
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(chief.Initialize().ok());
  waiter.join();
  std::vector<float> got(3);
  ASSERT_TRUE(other.Pull({PullItem::Of<float>(*w1, got)}).ok());
  EXPECT_EQ(got, init);
}

TEST_P(ClusterTest, ChiefUsesNamedInitializers) {
  StartCluster(1, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  TensorSpec spec{"kernel", DType::kF32, {64, 32}, UpdateRule::kSgd, {}, -1};
  spec.initializer = Initializer::GlorotUniform(/*seed=*/9);
  auto k0 = chief.Declare(spec);
  spec.initializer = {};  // only the chief's initializer matters
  auto k1 = other.Declare(spec);
  ASSERT_TRUE(k0.ok() && k1.ok());
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_TRUE(other.WaitForInit(5s).ok());
  std::vector<float> got(64 * 32);
  ASSERT_TRUE(other.Pull({PullItem::Of<float>(*k1, got)}).ok());
  auto expect = InitialValue(Initializer::GlorotUniform(9), "kernel", DType::kF32, {64, 32});
  ASSERT_TRUE(expect.ok());
  EXPECT_EQ(std::memcmp(got.data(), expect->data(), expect->size()), 0);
  auto bad = chief.Declare(
      {"ids", DType::kI32, {4}, UpdateRule::kAssign, {}, -1, {}, {}, Initializer::Normal(0, 1)});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(ClusterTest, WaitForInitTimesOutNamingTheChief) {
  StartCluster(1, 2);
  Client& other = Connect(1);
  auto start = std::chrono::steady_clock::now();
  Status st = other.WaitForInit(500ms);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("/job:worker/task:0"), std::string::npos) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST_P(ClusterTest, PlacementRoundRobinGreedyPinnedAndChunks) {
  StartCluster(3, 1);
  Client& c = Connect(0);
  auto t = c.DeclareMany({F32("a", 10), F32("b", 10), F32("c", 10), F32("d", 10)});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(c.info((*t)[0])->shards, std::vector<int>{0});
  EXPECT_EQ(c.info((*t)[1])->shards, std::vector<int>{1});
  EXPECT_EQ(c.info((*t)[2])->shards, std::vector<int>{2});
  EXPECT_EQ(c.info((*t)[3])->shards, std::vector<int>{0});
  auto pinned = F32("pinned", 1 << 20);  // 4 MiB = 4 chunks of 1 MiB
  pinned.pinned_shard = 2;
  auto p = c.Declare(pinned);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(c.info(*p)->shards, std::vector<int>(4, 2));
  auto big = c.Declare(F32("big", (5 << 20) / 4));  // 5 chunks spread round-robin
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(c.info(*big)->shards, (std::vector<int>{1, 2, 0, 1, 2}));
  auto bad = F32("nowhere", 4);
  bad.pinned_shard = 3;
  auto r = c.Declare(bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("nowhere"), std::string::npos);
}

TEST_P(ClusterTest, GreedyPlacementBalancesBytes) {
  StartCluster(2, 1);
  auto opts = Options(0);
  opts.placement = "greedy";
  auto c = Client::Connect(opts);
  ASSERT_TRUE(c.ok());
  auto t = (*c)->DeclareMany({F32("big", 1000), F32("s1", 10), F32("s2", 10), F32("s3", 10)});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*c)->info((*t)[0])->shards[0], 0);
  for (int i = 1; i < 4; ++i) EXPECT_EQ((*c)->info((*t)[i])->shards[0], 1) << i;
}

TEST_P(ClusterTest, DeclareMismatchNamesBoth) {
  StartCluster(1, 2);
  Client& a = Connect(0);
  Client& b = Connect(1);
  ASSERT_TRUE(a.Declare(F32("w", 10)).ok());
  auto r = b.Declare({"w", DType::kF64, {10}, UpdateRule::kAdd, {}, -1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists);
  const auto& msg = r.status().message();
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[10]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64[10]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/job:worker/task:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/job:worker/task:1"), std::string::npos) << msg;
  // Same declaration is fine and is the same parameter.
  EXPECT_TRUE(b.Declare(F32("w", 10)).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, ClusterTest,
                         ::testing::Values("native", "tcp", "posix,sysv,cma,tcp"),
                         ClusterTest::Name);

}  // namespace
}  // namespace tessera
