// The global step, push_pull, sync steps that drop, wait or fail, restarted
// workers and bounded staleness.
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

// Sync tensors declared after training began start where the workers are,
// the furthest step the shards' sync tensors reached (the global step may
// not count the last steps yet: the shards report them after the fact), and
// every worker learns that number (start_step). First the chief alone,
// straight after its steps; then both workers, the second waiting for the
// chief's init; then one that asks only after the chief was done.
TEST_P(ClusterTest, TensorsDeclaredLaterStartWhereTheChiefInitialisedThem) {
  StartCluster(2, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  auto sync = [](std::string name, uint32_t replicas) {
    TensorSpec spec = F32(std::move(name), 4);
    spec.mode = ConsistencyMode::Sync(replicas, replicas, /*average=*/false);
    return spec;
  };
  // Each worker pulls into its own buffer: both step at once below.
  std::vector<float> one(4, 1.0f), got(4), got_other(4);
  auto step = [&](Client& c, Tensor t, uint64_t s) {
    std::vector<float>& into = &c == &chief ? got : got_other;
    Status st = c.Push({PushItem::Of<float>(t, one)}, {.step = s});
    if (st.ok()) st = c.Pull({PullItem::AfterStep<float>(t, into, s + 1)});
    return st;
  };
  EXPECT_FALSE(chief.start_step().has_value()) << "before Initialize";
  auto a = chief.Declare(sync("a", 1)).value();
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_EQ(chief.start_step(), 0u);
  for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE(step(chief, a, s).ok()) << s;
  auto b = chief.Declare(sync("b", 1)).value();
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_EQ(chief.start_step(), 3u) << "where a is, whatever the global step has heard";
  ASSERT_TRUE(step(chief, b, 3).ok());
  EXPECT_EQ(got, one);

  const uint64_t now = 4;  // b's step 3 applied
  TensorSpec shared = sync("c", 2);
  ASSERT_TRUE(other.Declare(shared).ok());
  Future waited = other.WaitForInitAsync(30s);
  auto c_chief = chief.Declare(shared).value();
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_TRUE(waited.Wait().ok()) << waited.Wait().ToString();
  EXPECT_EQ(chief.start_step(), now);
  EXPECT_EQ(other.start_step(), now);
  auto c_other = other.Find("c").value();
  std::thread second([&] { EXPECT_TRUE(step(other, c_other, now).ok()); });
  ASSERT_TRUE(step(chief, c_chief, now).ok());
  second.join();
  EXPECT_EQ(got, std::vector<float>(4, 2.0f)) << "both workers' step";
  EXPECT_EQ(got_other, got);

  // The second worker declares only once the chief initialised: it starts
  // where the chief started d, straight after the step above.
  auto d_chief = chief.Declare(sync("d", 2)).value();
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_EQ(chief.start_step(), now + 1);
  auto d_other = other.Declare(sync("d", 2)).value();
  ASSERT_TRUE(other.WaitForInit(30s).ok());
  EXPECT_EQ(other.start_step(), now + 1);
  std::thread late([&] { EXPECT_TRUE(step(other, d_other, now + 1).ok()); });
  ASSERT_TRUE(step(chief, d_chief, now + 1).ok());
  late.join();
}

TEST_P(ClusterTest, GlobalStepCountsAsyncPushes) {
  StartCluster(1, 2);
  Client& a = Connect(0);
  Client& b = Connect(1);
  auto wa = a.Declare(F32("w", 2)).value();
  auto wb = b.Declare(F32("w", 2)).value();
  ASSERT_TRUE(a.Initialize().ok());
  EXPECT_EQ(a.GlobalStep().value(), 0u) << "initialising is not a step";
  std::vector<float> v(2, 1.0f);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a.Push({PushItem::Of<float>(wa, v)}).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(b.Push({PushItem::Of<float>(wb, v)}).ok());
  EXPECT_EQ(EventualGlobalStep(b, 5), 5u);
}

// The shards count the global step: a push's part to the lowest-numbered
// shard counts its worker's step. A push spread over two shards counts once,
// and a push carries no message besides itself.
TEST_P(ClusterTest, ShardsCountAsyncStepsOncePerPush) {
  StartCluster(2, 1);
  auto opts = Options(0);
  opts.heartbeat_timeout = 0ms;  // no pings among the counted messages
  auto client = Client::Connect(opts);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Client& c = **client;
  TensorSpec on_first = F32("a", 2), on_second = F32("b", 2);
  on_first.pinned_shard = 0;
  on_second.pinned_shard = 1;
  auto t = c.DeclareMany({on_first, on_second}).value();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> v(2, 1.0f);
  auto before = c.counters();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(c.Push({PushItem::Of<float>(t[1], v)}).ok());
  EXPECT_EQ(c.counters().messages_sent - before.messages_sent, 10u) << "one message per push";
  EXPECT_EQ(EventualGlobalStep(c, 10), 10u);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.Push({PushItem::Of<float>(t[0], v), PushItem::Of<float>(t[1], v)}).ok());
  }
  EXPECT_EQ(EventualGlobalStep(c, 15), 15u);
  EXPECT_EQ(c.GlobalStep().value(), 15u) << "a push over two shards counts once";
  EXPECT_EQ(servers_[0]->stats().step_messages_from_workers, 0u);
}

// push_pull answers with the weights after the push: in one message each
// way for tensors that travel inline, as a push then a pull for larger ones
// (here chunked over both shards).
TEST_P(ClusterTest, PushPullReturnsTheWeightsAfterThePush) {
  StartCluster(2, 1);
  auto opts = Options(0);
  opts.heartbeat_timeout = 0ms;  // no pings among the counted messages
  auto client = Client::Connect(opts);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Client& c = **client;
  const int64_t big_n = 3 * (1 << 20) / 4;  // 3 MiB: 3 chunks of 1 MiB
  TensorSpec small = F32("small", 4);
  small.pinned_shard = 1;
  auto t = c.DeclareMany({small, F32("big", big_n)}).value();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> grad(4, 1.0f), got(4);
  for (int i = 1; i <= 3; ++i) {
    const auto before = c.counters();
    ASSERT_TRUE(c.PushPull({{t[0], grad.data(), got.data(), 16}}).ok());
    EXPECT_EQ(got, std::vector<float>(4, static_cast<float>(i)));
    const auto after = c.counters();
    EXPECT_EQ(after.messages_sent - before.messages_sent, 1u) << "one round trip";
    EXPECT_EQ(after.messages_received - before.messages_received, 1u);
  }
  std::vector<float> big_grad(static_cast<size_t>(big_n), 0.5f), big_got(big_grad.size());
  ASSERT_TRUE(c.PushPull({{t[1], big_grad.data(), big_got.data(), big_grad.size() * 4}}).ok());
  EXPECT_EQ(big_got, std::vector<float>(big_grad.size(), 0.5f));
  EXPECT_EQ(EventualGlobalStep(c, 0), 0u) << "push_pull counts no step, as before";
}

// A push asking for the weights back is refused where it cannot be served:
// its bytes not inline, or a sync tensor (its weights change only when the
// step applies). The connection survives.
TEST_P(ClusterTest, PushThenPullIsRefusedWhereItCannotBeServed) {
  StartCluster(1, 2);
  Client& c = Connect(0);
  TensorSpec sync = F32("s", 4);
  sync.mode = ConsistencyMode::Sync(2, 2, false);
  ASSERT_TRUE(c.DeclareMany({F32("a", 4), sync}).ok());
  ASSERT_TRUE(c.Initialize().ok());
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(1))).ok());
  const std::vector<uint8_t> bytes(16, 0);
  const uint32_t async_key = 0, sync_key = 1;  // created in the order declared
  raw.Send(wire::Push{0, {{sync_key, 0, 16}}, bytes}, 3, wire::kFlagThenPull);
  auto refused = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_NE(refused->message.find("which is sync"), std::string::npos) << refused->message;
  raw.Send(wire::Push{0, {{async_key, 0, 16}}, {}}, 4, wire::kFlagThenPull);
  refused = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_NE(refused->message.find("inline"), std::string::npos) << refused->message;
  raw.Send(wire::Push{0, {{async_key, 0, 16}}, bytes}, 5, wire::kFlagThenPull);
  auto weights = wire::Decode<wire::PullReply>(raw.Next());
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  EXPECT_EQ(weights->data, bytes) << "zero plus a zero gradient";
}

// A worker has no step to report: the shards count steps. One that sends a
// step report anyway is disconnected, and the global step does not move.
TEST_P(ClusterTest, WorkerStepReportIsRefused) {
  StartCluster(1, 2);
  Client& c = Connect(0);
  ASSERT_TRUE(c.Declare(F32("w", 4)).ok());
  ASSERT_TRUE(c.Initialize().ok());
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(1))).ok());
  raw.Send(wire::StepsApplied{1000, 0, {}}, 3);
  auto refused = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_NE(refused->message.find("unexpected steps-applied from a worker"), std::string::npos)
      << refused->message;
  EXPECT_EQ(servers_[0]->stats().step_messages_from_workers, 1u);
  EXPECT_EQ(c.GlobalStep().value(), 0u);
}

// Sync training, 2 shards x 3 workers x 100 steps, every tensor chunked over
// both shards: the coordinator hears at most one step report per ps task per
// step and nothing from the workers, and the global step is exact.
TEST_P(ClusterTest, ShardsReportEachSyncStepAtMostOnce) {
  StartCluster(2, 3);
  const int64_t n = 64;
  TensorSpec spec{"w", DType::kF64, {n}, UpdateRule::kAdd, {}, -1};
  spec.mode = ConsistencyMode::Sync(3, 3, /*average=*/false);
  std::vector<Client*> workers;
  std::vector<Tensor> handles;
  for (int w = 0; w < 3; ++w) {
    auto opts = Options(w);
    opts.chunk_bytes = 256;  // 2 chunks of 32 elements: one on each shard
    clients_.push_back(testing::ValueOrThrow(Client::Connect(opts), "connecting a worker"));
    workers.push_back(clients_.back().get());
    handles.push_back(workers.back()->Declare(spec).value());
  }
  ASSERT_EQ(workers[0]->info(handles[0]).value().chunks.size(), 2u);
  ASSERT_TRUE(workers[0]->Initialize().ok());
  const int steps = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      if (!workers[w]->WaitForInit(10s).ok()) failures++;
      std::vector<double> g(n, 1.0), got(n);
      for (int t = 0; t < steps; ++t) {
        if (!workers[w]->Push({PushItem::Of<double>(handles[w], g)}, {.step = t}).ok()) failures++;
        if (!workers[w]->Pull({PullItem::AfterStep<double>(handles[w], got, t + 1)}).ok()) {
          failures++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures, 0);
  EXPECT_EQ(EventualGlobalStep(*workers[0], steps), static_cast<uint64_t>(steps));
  const ServerStats coordinator = servers_[0]->stats();
  ASSERT_EQ(coordinator.step_reports_from_ps.size(), 2u);
  uint64_t reports = 0;
  for (uint64_t r : coordinator.step_reports_from_ps) {
    EXPECT_LE(r, static_cast<uint64_t>(steps)) << "more than one report per ps task per step";
    reports += r;
  }
  EXPECT_GE(reports, static_cast<uint64_t>(steps)) << "every step was reported";
  EXPECT_EQ(coordinator.step_messages_from_workers, 0u);
}

// replicas_to_aggregate = 2 of 3: a third push for an applied step is a
// backup or stale push and is dropped and counted; a second push of the same
// step by one worker is dropped as a duplicate; a pull for step t+1 waits.
TEST_P(ClusterTest, SyncDropsStaleBackupAndDuplicatePushes) {
  StartCluster(1, 3);
  TensorSpec spec{"w", DType::kF32, {4}, UpdateRule::kAdd, {}, -1};
  spec.mode = ConsistencyMode::Sync(2, 3, /*average=*/false);
  std::vector<Client*> c;
  std::vector<Tensor> t;
  for (int w = 0; w < 3; ++w) {
    c.push_back(&Connect(w));
    t.push_back(c.back()->Declare(spec).value());
  }
  ASSERT_TRUE(c[0]->Initialize().ok());
  std::vector<float> one(4, 1.0f), got(4);
  auto waiting = c[2]->PullAsync({PullItem::AfterStep<float>(t[2], got, 1)});
  ASSERT_TRUE(c[0]->Push({PushItem::Of<float>(t[0], one)}, {.step = 0}).ok());
  ASSERT_TRUE(c[0]->Push({PushItem::Of<float>(t[0], one)}, {.step = 0}).ok());  // duplicate
  EXPECT_EQ(c[0]->counters().chunks_dropped_duplicate, 1u);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(waiting.ready()) << "step 0 has 1 of 2 replicas";
  ASSERT_TRUE(c[1]->Push({PushItem::Of<float>(t[1], one)}, {.step = 0}).ok());
  ASSERT_TRUE(waiting.Wait().ok());
  EXPECT_EQ(got, std::vector<float>(4, 2.0f));
  ASSERT_TRUE(c[2]->Push({PushItem::Of<float>(t[2], one)}, {.step = 0}).ok());  // backup: too late
  EXPECT_EQ(c[2]->counters().chunks_dropped_stale, 1u);
  auto stats = servers_[0]->stats();
  EXPECT_EQ(stats.stale_pushes_dropped, 1u);
  EXPECT_EQ(stats.duplicate_pushes_dropped, 1u);
  EXPECT_EQ(stats.sync_steps_applied, 1u);
  // Step 1 goes on without the backup's stale contribution.
  ASSERT_TRUE(c[2]->Push({PushItem::Of<float>(t[2], one)}, {.step = 1}).ok());
  ASSERT_TRUE(c[1]->Push({PushItem::Of<float>(t[1], one)}, {.step = 1}).ok());
  ASSERT_TRUE(c[0]->Pull({PullItem::AfterStep<float>(t[0], got, 2)}).ok());
  EXPECT_EQ(got, std::vector<float>(4, 4.0f));
}

// A sync step that lost the worker it needed fails its waiting pulls with an
// error naming that worker, instead of hanging until a timeout.
TEST_P(ClusterTest, SyncStepFailsNamingTheMissingWorker) {
  // Not back within its rejoin grace: gone.
  configure_server_ = [](ServerOptions& o) { o.worker_rejoin_grace = 200ms; };
  auto [c0, c1, c2, t0, t1] = ThreeSyncWorkers(/*replicas_to_aggregate=*/3);
  std::vector<float> one(4, 1.0f), got(4);
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, {.step = 0}).ok());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, {.step = 0}).ok());
  auto waiting = c0.PullAsync({PullItem::AfterStep<float>(t0, got, 1)});
  c2.reset();  // worker 2 goes away without pushing step 0
  Status st = waiting.WaitFor(10s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("/job:worker/task:2"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("not back within 200 ms"), std::string::npos) << st.ToString();
  // A new pull for that step fails at once.
  st = c1.Pull({PullItem::AfterStep<float>(t1, got, 1)});
  EXPECT_NE(st.message().find("/job:worker/task:2"), std::string::npos) << st.ToString();
}

// Workers restarted one after the other: a pull that needs a worker that
// left waits for it to come back within the rejoin grace, rather than fail
// at once naming it (the restarted workers blamed each other so).
TEST_P(ClusterTest, ASyncStepWaitsForAWorkerThatComesBack) {
  auto [c0, c1, c2, t0, t1] = ThreeSyncWorkers(/*replicas_to_aggregate=*/3);
  std::vector<float> one(4, 1.0f), got(4);
  c2.reset();  // worker 2 restarts: gone before it pushed step 0
  ASSERT_TRUE(testing::WaitUntil([&] { return servers_[0]->stats().worker_departures == 1; }, 10s));
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, {.step = 0}).ok());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, {.step = 0}).ok());
  auto waiting = c0.PullAsync({PullItem::AfterStep<float>(t0, got, 1)});
  Client& back = Connect(2);
  TensorSpec spec{"w", DType::kF32, {4}, UpdateRule::kAdd, {}, -1};
  spec.mode = ConsistencyMode::Sync(3, 3, /*average=*/false);  // as ThreeSyncWorkers
  Tensor t2 = back.Declare(spec).value();
  ASSERT_TRUE(back.WaitForInit().ok());
  EXPECT_FALSE(waiting.ready());
  ASSERT_TRUE(back.Push({PushItem::Of<float>(t2, one)}, {.step = 0}).ok());
  ASSERT_TRUE(waiting.Wait().ok()) << waiting.Wait().ToString();
  EXPECT_EQ(got, std::vector<float>(4, 3.0f));
}

// With replicas_to_aggregate still reachable, the step completes without the
// lost worker.
TEST_P(ClusterTest, SyncStepCompletesWithTheRemainingReplicas) {
  auto [c0, c1, c2, t0, t1] = ThreeSyncWorkers(/*replicas_to_aggregate=*/2);
  c2.reset();
  std::this_thread::sleep_for(200ms);
  std::vector<float> one(4, 1.0f), got(4);
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, {.step = 0}).ok());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, {.step = 0}).ok());
  ASSERT_TRUE(c0.Pull({PullItem::AfterStep<float>(t0, got, 1)}).ok());
  EXPECT_EQ(got, std::vector<float>(4, 2.0f));
}

// A restarted worker rejoins: no re-initialisation, it sees the current values.
TEST_P(ClusterTest, RestartedWorkerRejoinsWithoutReinitialising) {
  StartCluster(1, 2);
  Client& chief = Connect(0);
  auto w = chief.Declare(F32("w", 2)).value();
  ASSERT_TRUE(chief.Initialize().ok());
  std::vector<float> one(2, 1.0f), got(2);
  {
    auto worker = Client::Connect(Options(1));
    ASSERT_TRUE(worker.ok());
    auto w1 = (*worker)->Declare(F32("w", 2)).value();
    ASSERT_TRUE((*worker)->WaitForInit(5s).ok());
    ASSERT_TRUE((*worker)->Push({PushItem::Of<float>(w1, one)}).ok());
  }
  auto again = Client::Connect(Options(1));
  ASSERT_TRUE(again.ok());
  auto w1 = (*again)->Declare(F32("w", 2)).value();
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*again)->WaitForInit(5s).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "the cluster is initialised already";
  ASSERT_TRUE((*again)->Pull({PullItem::Of<float>(w1, got)}).ok());
  EXPECT_EQ(got, one) << "the value after the first incarnation's push, not the initial zeros";
  ASSERT_TRUE(chief.Push({PushItem::Of<float>(w, one)}).ok());
}

// Stale-synchronous: a worker at step t may read weights only once every
// worker pushed step t - s.
TEST_P(ClusterTest, BoundedStalenessWaitsForTheSlowestWorker) {
  StartCluster(1, 2);
  TensorSpec spec{"w", DType::kF32, {2}, UpdateRule::kAdd, {}, -1};
  spec.mode = ConsistencyMode::Bounded(1);
  Client& fast = Connect(0);
  Client& slow = Connect(1);
  auto tf = fast.Declare(spec).value();
  auto ts = slow.Declare(spec).value();
  ASSERT_TRUE(fast.Initialize().ok());
  std::vector<float> one(2, 1.0f), got(2);
  for (uint64_t step = 0; step < 3; ++step)
    ASSERT_TRUE(fast.Push({PushItem::Of<float>(tf, one)}, {.step = step}).ok());
  // fast is at step 3 with s = 1: it needs every worker past step 1 (2 steps pushed).
  auto pull = fast.PullAsync({PullItem::AfterStep<float>(tf, got, 3 - 1)});
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(pull.ready());
  ASSERT_TRUE(slow.Push({PushItem::Of<float>(ts, one)}, {.step = 0}).ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(pull.ready()) << "slow has pushed 1 step, 2 are needed";
  ASSERT_TRUE(slow.Push({PushItem::Of<float>(ts, one)}, {.step = 1}).ok());
  ASSERT_TRUE(pull.Wait().ok());
  EXPECT_EQ(got, std::vector<float>(2, 5.0f));
}

// TensorFlow's dedicated "chief" task: it is rank 0, initialises, and the
// workers wait for it.
TEST_P(ClusterTest, DedicatedChiefTaskInitialises) {
  ASSERT_TRUE(spec_.AddJob("chief", {{"127.0.0.1", testing::UnusedPortsBeside(spec_, 1)[0]}}).ok());
  StartCluster(1, 1);
  auto chief_opts = Options(0);
  chief_opts.task = {"chief", 0};
  auto chief = Client::Connect(chief_opts);
  ASSERT_TRUE(chief.ok()) << chief.status().ToString();
  Client& worker = Connect(0);
  EXPECT_TRUE((*chief)->is_chief());
  EXPECT_FALSE(worker.is_chief());
  auto spec = F32("w", 2);
  spec.initializer = Initializer::Constant(4.0);
  auto wc = (*chief)->Declare(spec);
  auto ww = worker.Declare(spec);
  ASSERT_TRUE(wc.ok() && ww.ok());
  EXPECT_EQ(worker.Initialize().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*chief)->Initialize().ok());
  ASSERT_TRUE(worker.WaitForInit(5s).ok());
  std::vector<float> got(2);
  ASSERT_TRUE(worker.Pull({PullItem::Of<float>(*ww, got)}).ok());
  EXPECT_EQ(got, std::vector<float>(2, 4.0f));
}

}  // namespace
}  // namespace tessera
