// Dedicated coordinator and chief tasks, and shards that die or hang.
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

TEST_P(ClusterTest, SeparateCoordinatorTask) {
  ASSERT_TRUE(
      spec_.AddJob("coordinator", {{"127.0.0.1", testing::UnusedPortsBeside(spec_, 1)[0]}}).ok());
  StartCluster(2, 2);
  ServerOptions opts;
  opts.cluster = spec_;
  opts.job = "coordinator";
  opts.secret = secret_;
  opts.transport = transport_;
  auto coordinator = Server::Start(opts);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Client& a = Connect(0);
  Client& b = Connect(1);
  auto wa = a.DeclareMany({F32("x", 2), F32("y", 2)});
  auto wb = b.DeclareMany({F32("y", 2), F32("x", 2)});  // other order, same placement
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_EQ(a.info((*wa)[0])->shards, b.info((*wb)[1])->shards);
  EXPECT_EQ(a.info((*wa)[1])->shards, std::vector<int>{1});
  ASSERT_TRUE(a.Initialize().ok());
  ASSERT_TRUE(b.WaitForInit(5s).ok());
  std::vector<float> v = {1, 2}, got(2);
  ASSERT_TRUE(b.Push({PushItem::Of<float>((*wb)[0], v)}).ok());
  ASSERT_TRUE(a.Pull({PullItem::Of<float>((*wa)[1], got, 2)}).ok());
  EXPECT_EQ(got, v);
  clients_.clear();
  (*coordinator)->Stop();
}

// Pushes to tensor t until one fails (or 10 s pass); returns that status and
// how long it took.
std::pair<Status, std::chrono::steady_clock::duration> PushUntilFailure(Client& c, Tensor t) {
  auto start = std::chrono::steady_clock::now();
  std::vector<float> v(4);
  Status st;
  while (std::chrono::steady_clock::now() - start < 10s) {
    st = c.Push({PushItem::Of<float>(t, v)});
    if (!st.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  return {st, std::chrono::steady_clock::now() - start};
}

// A shard process killed with SIGKILL: the worker's next call fails within
// seconds with an error naming the shard, and the other shard keeps serving.
TEST_P(ClusterTest, KilledShardProcessIsReportedQuickly) {
  auto shards = TwoShardProcesses();
  if (!shards->started()) GTEST_SKIP() << "TESSERA_BIN is not set (run through meson test)";
  Client& c = Connect(0);
  auto t = c.DeclareMany({F32("a", 4), F32("b", 4)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c.Initialize().ok());
  kill(shards->pid(1), SIGKILL);
  auto [st, took] = PushUntilFailure(c, (*t)[1]);
  EXPECT_FALSE(st.ok()) << "the dead shard was never reported";
  EXPECT_NE(st.message().find("/job:ps/task:1"), std::string::npos) << st.ToString();
  EXPECT_LT(took, 5s);
  std::vector<float> v(4);
  EXPECT_TRUE(c.Push({PushItem::Of<float>((*t)[0], v)}).ok()) << "ps 0 still serves";
}

// A shard that hangs (SIGSTOP: its connections stay open) is found by the
// heartbeats within their timeout; nobody waits forever.
TEST_P(ClusterTest, HungShardIsFoundByHeartbeats) {
  auto shards = TwoShardProcesses();
  if (!shards->started()) GTEST_SKIP() << "TESSERA_BIN is not set (run through meson test)";
  auto opts = Options(0);
  opts.heartbeat_interval = 200ms;
  opts.heartbeat_timeout = 1s;
  auto c = Client::Connect(opts);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto t = (*c)->DeclareMany({F32("a", 4), F32("b", 4)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*c)->Initialize().ok());
  kill(shards->pid(1), SIGSTOP);
  auto [st, took] = PushUntilFailure(**c, (*t)[1]);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("/job:ps/task:1"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("heartbeat"), std::string::npos) << st.ToString();
  EXPECT_LT(took, 3s);
  kill(shards->pid(1), SIGCONT);
}

// This worker's own progress loop held up for three heartbeat timeouts (a
// completion callback that blocks stands in for a long synchronous
// registration or a slow emulated step): its live shards are not taken for
// dead ones, and its next calls work. Before liveness counted only listening
// time, the first heartbeat after the stall declared both shards dead.
TEST_P(ClusterTest, OwnStalledLoopDoesNotKillLiveShards) {
  StartCluster(2, 2);
  auto opts = Options(0);
  opts.heartbeat_interval = 100ms;
  opts.heartbeat_timeout = 500ms;
  auto c = Client::Connect(opts);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Client& other = Connect(1);
  auto t = (*c)->DeclareMany({F32("a", 4), F32("b", 4)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(other.DeclareMany({F32("a", 4), F32("b", 4)}).ok());
  ASSERT_TRUE((*c)->Initialize().ok());
  ASSERT_EQ((*c)->info((*t)[0])->shards != (*c)->info((*t)[1])->shards, true)
      << "the two tensors should live on different shards";

  // A pull that waits for version 2 completes on the client's progress
  // thread once `other` pushes; its callback then blocks that thread.
  std::vector<float> got(4), one(4, 1.0f);
  std::atomic<bool> stall_over{false};
  auto pull = (*c)->PullAsync({PullItem::Of<float>((*t)[0], got, 2)});
  pull.Then([&](const Status&) {
    std::this_thread::sleep_for(1500ms);  // the stall itself, not a wait for a condition
    stall_over = true;
  });
  auto other_a = other.Find("a");
  ASSERT_TRUE(other_a.ok());
  ASSERT_TRUE(other.Push({PushItem::Of<float>(*other_a, one)}).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return stall_over.load(); }, 30s));
  ASSERT_TRUE(pull.Wait().ok());
  for (int round = 0; round < 5; ++round) {  // five heartbeat intervals after the stall
    ASSERT_TRUE((*c)->Push({PushItem::Of<float>((*t)[0], one)}).ok()) << round;
    ASSERT_TRUE((*c)->Push({PushItem::Of<float>((*t)[1], one)}).ok()) << round;
    std::this_thread::sleep_for(100ms);
  }
}

// Small calls beside a CPU hog on every core, as on a training host: a guard
// against a cliff, not a speed target. Quiet, a call takes microseconds; a
// progress loop that spins with sched_yield made each one wait for a 4 ms
// scheduler tick.
TEST_P(ClusterTest, SmallCallsStayFastBesideACpuHog) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto t = c.Declare(F32("w", 2));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> one(2, 1.0f), got(2);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(c.Push({PushItem::Of<float>(*t, one)}).ok());
  tools::CpuHog hog;
  ASSERT_GT(hog.processes(), 0);
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c.Push({PushItem::Of<float>(*t, one)}).ok());
    ASSERT_TRUE(c.Pull({PullItem::Of<float>(*t, got)}).ok());
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        2);
  }
  std::sort(us.begin(), us.end());
  const double median = us[us.size() / 2];
  RecordProperty("median_us_beside_hog", std::to_string(median));
  EXPECT_LT(median, 1000.0) << "median of a push or pull beside a CPU hog: " << median
                            << " us (p90 " << us[us.size() * 9 / 10] << " us)";
}

}  // namespace
}  // namespace tessera
