// What a trainer written against include/tessera, or a peer that breaks the
// rules, must never get: a call that reports success but lost a gradient, a
// connection broken by one refused request, a cluster spec mismatch reported
// as something else, a coordinator exhausted by one declare, a shard held
// open by strangers. Each case is a finding of the hardening review.
#include <gtest/gtest.h>

#include <csignal>

#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using testing::ClusterTest;
using testing::RawPeer;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Finding 7: the README's Connect(...).value() with an error used to read an
// empty optional (rc 139, no message).
TEST(ResultDeathTest, ValueOfAnErrorNamesItAndAborts) {
  Result<int> r = Status::NotFound("no cluster given: TF_CONFIG is not set");
  EXPECT_DEATH((void)r.value(), "Result that holds an error was read: NotFound: no cluster given");
  EXPECT_DEATH((void)*r, "NotFound");
}

using HardeningTest = ClusterTest;

// Finding 8: a declare the shard refuses costs that request only.
TEST_P(HardeningTest, RefusedDeclareLeavesTheConnectionUsable) {
  StartCluster(1, 1);
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(0))).ok());
  wire::Declare bad{1u << 20, 1, {}};
  bad.tensors.push_back({"counts", DType::kI32, UpdateRule::kAdam, {4}, -1, {}, {}});
  raw.Send(bad, 5);
  auto refused = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->code, StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(refused->message, "needs a floating dtype")) << refused->message;
  raw.Send(wire::Ping{}, 6);
  EXPECT_TRUE(wire::Decode<wire::Ack>(raw.Next()).ok()) << "the connection did not survive";

  // The client refuses it before sending, and keeps working.
  Client& c = Connect(0);
  auto i32_adam = c.Declare({"counts", DType::kI32, {4}, UpdateRule::kAdam, {}, -1});
  ASSERT_FALSE(i32_adam.ok());
  EXPECT_EQ(i32_adam.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.Declare(F32("w", 4)).ok());
  EXPECT_TRUE(c.Initialize().ok());
}

// Finding 12: Client::info used .at() on the handle, so a handle this
// client never declared threw through the API.
TEST_P(HardeningTest, InfoOfAnUnknownHandleIsAnError) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto info = c.info(Tensor{12345});
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument) << info.status();
}

// Finding 9: a sync push without a step counted as step 0, so the worker's
// real step-0 push was later dropped as stale; push_pull dropped its gradient.
TEST_P(HardeningTest, SyncTensorsRefuseCallsThatWouldDropTheGradient) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  TensorSpec spec = F32("w", 4);
  spec.mode = ConsistencyMode::Sync(1, 1, false);
  auto w = c.Declare(spec);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> grad(4, 1.0f), got(4);
  Status untagged = c.Push({PushItem::Of<float>(*w, grad)});
  EXPECT_EQ(untagged.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(untagged.message(), "'w'")) << untagged.ToString();
  EXPECT_TRUE(Contains(untagged.message(), "Push(items, step)")) << untagged.ToString();
  Status push_pull = c.PushPull({{*w, grad.data(), got.data(), 16}});
  EXPECT_EQ(push_pull.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(push_pull.message(), "tensor 'w', which is sync")) << push_pull.ToString();

  ASSERT_TRUE(c.Push({PushItem::Of<float>(*w, grad)}, {.step = 0}).ok());
  ASSERT_TRUE(c.Pull({PullItem::AfterStep<float>(*w, got, 1)}).ok());
  EXPECT_EQ(got, std::vector<float>(4, 1.0f)) << "step 0's gradient was lost";
  EXPECT_EQ(c.counters().chunks_dropped_stale, 0u);
}

// Issue 44: a push's entries are applied one by one, and one could fail
// after others were applied; the push then answered with one error and no
// versions, so the caller could not tell what had changed (and a retry
// would apply the others twice). Each entry now reports: refused with its
// reason, or applied with its version.
TEST_P(HardeningTest, APushWithARefusedEntryAccountsForEveryEntry) {
  setenv("TESSERA_FAIL_AT", "apply-push-entry:2", 1);  // the 2nd entry of the 1st push
  StartCluster(1, 1);
  unsetenv("TESSERA_FAIL_AT");
  Client& c = Connect(0);
  std::vector<Tensor> t;
  for (const char* name : {"a", "b", "c"}) {
    auto h = c.Declare(F32(name, 4));
    ASSERT_TRUE(h.ok()) << h.status();
    t.push_back(*h);
  }
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> one(4, 1.0f);
  Status st = c.Push({PushItem::Of<float>(t[0], one), PushItem::Of<float>(t[1], one),
                      PushItem::Of<float>(t[2], one)});
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st;
  EXPECT_TRUE(Contains(st.message(), "1 of 3 chunks of this push refused")) << st;
  EXPECT_TRUE(Contains(st.message(), "'b' chunk 0: tensor 'b': failure injected")) << st;
  EXPECT_TRUE(Contains(st.message(), "Applied: 'a' chunk 0 (version")) << st;
  EXPECT_TRUE(Contains(st.message(), "'c' chunk 0 (version")) << st;
  std::vector<float> a(4), b(4), cc(4);
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(t[0], a), PullItem::Of<float>(t[1], b),
                      PullItem::Of<float>(t[2], cc)})
                  .ok());
  EXPECT_EQ(a, std::vector<float>(4, 1.0f)) << "an entry reported applied was not";
  EXPECT_EQ(b, std::vector<float>(4, 0.0f)) << "the refused entry changed";
  EXPECT_EQ(cc, std::vector<float>(4, 1.0f)) << "an entry after the refused one was not applied";
}

// The same for push_pull, whose reply would have been the weights.
TEST_P(HardeningTest, APushPullWithARefusedEntryAccountsForEveryEntry) {
  setenv("TESSERA_FAIL_AT", "apply-push-entry:1", 1);
  StartCluster(1, 1);
  unsetenv("TESSERA_FAIL_AT");
  Client& c = Connect(0);
  auto a = c.Declare(F32("a", 4));
  auto b = c.Declare(F32("b", 4));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> one(4, 1.0f), out_a(4), out_b(4);
  Status st = c.PushPull({{*a, one.data(), out_a.data(), 16}, {*b, one.data(), out_b.data(), 16}});
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st;
  EXPECT_TRUE(Contains(st.message(), "1 of 2 tensors refused (tensor 'a': failure injected")) << st;
  EXPECT_TRUE(Contains(st.message(), "the others were applied: 'b' (version")) << st;
  std::vector<float> got_b(4);
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*b, got_b)}).ok());
  EXPECT_EQ(got_b, std::vector<float>(4, 1.0f));
}

// Finding 11: a sync step whose update failed was logged, and the step
// advanced as if it had applied: its pushers, told OK when their gradients
// were counted, never learnt. Every later pull and push of it now fails,
// naming the step and who pushed it.
TEST_P(HardeningTest, FailedSyncStepIsAnErrorToEveryPusher) {
  setenv("TESSERA_FAIL_AT", "apply-step:2", 1);  // step 1's update fails
  auto [c0, c1, c2, t0, t1] = ThreeSyncWorkers(/*replicas_to_aggregate=*/2);
  unsetenv("TESSERA_FAIL_AT");
  std::vector<float> one(4, 1.0f), got(4);
  for (uint64_t step : {0, 1}) {
    ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, {.step = step}).ok());
    ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, {.step = step}).ok());
  }
  for (Client* c : {&c0, &c1}) {
    Status st = c->Pull({PullItem::AfterStep<float>(c == &c0 ? t0 : t1, got, 2)});
    EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
    EXPECT_TRUE(
        Contains(st.message(),
                 "tensor 'w': sync step 1 (pushed by /job:worker/task:0, /job:worker/task:1) "
                 "could not be applied"))
        << st.ToString();
    EXPECT_TRUE(Contains(st.message(), "failure injected at 'apply-step'")) << st.ToString();
  }
  Status late = c2->Push({PushItem::Of<float>(c2->Find("w").value(), one)}, {.step = 2});
  EXPECT_TRUE(Contains(late.message(), "sync step 1")) << late.ToString();
}

// Finding 21: a sync step that could not complete failed after the op
// timeout with "operation did not complete within 60000 ms", naming nothing;
// a chief that never pushes (as TF2 users are used to) hung so with
// Sync(0, 0). The shard now answers in time, naming who has not pushed.
TEST_P(HardeningTest, StuckSyncStepNamesTheStepAndWhoHasNotPushed) {
  StartCluster(1, 3);
  TensorSpec spec = F32("w", 4);
  spec.mode = ConsistencyMode::Sync(0, 0, false);  // every worker, the chief included
  Client& chief = Connect(0);
  ASSERT_TRUE(chief.Declare(spec).ok());
  ASSERT_TRUE(chief.Initialize().ok());
  std::vector<std::unique_ptr<Client>> workers;
  for (int i : {1, 2}) {
    ClientOptions opts = Options(i);
    opts.op_timeout = 5s;  // the shard answers after 4 s
    workers.push_back(Client::Connect(opts).value());
    ASSERT_TRUE(workers.back()->Declare(spec).ok());
    ASSERT_TRUE(workers.back()->WaitForInit(10s).ok());
  }
  std::vector<float> one(4, 1.0f), got(4);
  for (auto& w : workers) {
    ASSERT_TRUE(w->Push({PushItem::Of<float>(w->Find("w").value(), one)}, {.step = 0}).ok());
  }
  Status st = workers[0]->Pull({PullItem::AfterStep<float>(workers[0]->Find("w").value(), got, 1)});
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_TRUE(Contains(st.message(),
                       "tensor 'w': sync step 0 has 2 of the 3 gradients it needs; pushed by "
                       "/job:worker/task:1, /job:worker/task:2; not pushed by /job:worker/task:0"))
      << st.ToString();
}

// Finding 9: a dropped sync push (a backup worker's, or a second push of
// the same step) left its only trace in a counter. The call's result names
// each dropped chunk.
TEST_P(HardeningTest, DroppedChunksAreNamedInTheCallsResult) {
  auto [c0, c1, c2, t0, t1] = ThreeSyncWorkers(/*replicas_to_aggregate=*/2);
  std::vector<float> one(4, 1.0f);
  std::vector<DroppedChunk> dropped;
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, {.step = 0}, &dropped).ok());
  EXPECT_TRUE(dropped.empty());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, {.step = 0}).ok());
  // Worker 2 is the backup: step 0 had its two replicas.
  Tensor t2 = c2->Find("w").value();
  ASSERT_TRUE(c2->Push({PushItem::Of<float>(t2, one)}, {.step = 0}, &dropped).ok());
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].tensor, "w");
  EXPECT_EQ(dropped[0].chunk, 0u);
  EXPECT_EQ(dropped[0].step, 0u);
  EXPECT_EQ(dropped[0].why, DroppedChunk::Why::kStale);
  // A second push of step 1 by one worker.
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, {.step = 1}).ok());
  Future again = c0.PushAsync({PushItem::Of<float>(t0, one)}, {.step = 1});
  ASSERT_TRUE(again.Wait().ok());
  ASSERT_EQ(again.dropped().size(), 1u);
  EXPECT_EQ(again.dropped()[0].why, DroppedChunk::Why::kDuplicate);
  EXPECT_EQ(again.dropped()[0].step, 1u);
}

// Finding 10: "x/adam_m" beside an Adam tensor "x" broke every checkpoint.
TEST_P(HardeningTest, NamesReservedForOptimizerStateAreRefused) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  for (const char* name : {"x/adam_m", "layer/0/momentum", "emb/master"}) {
    auto r = c.Declare(F32(name, 4));
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_TRUE(Contains(r.status().message(), "reserved for optimizer state")) << r.status();
  }
  // A peer that skips the client's check meets the coordinator's.
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(0))).ok());
  wire::Declare declare{1u << 20, 1, {}};
  declare.tensors.push_back({"x/adam_v", DType::kF32, UpdateRule::kAdd, {4}, -1, {}, {}});
  raw.Send(declare, 3);
  auto refused = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(refused.ok());
  EXPECT_TRUE(Contains(refused->message, "reserved for optimizer state")) << refused->message;
  EXPECT_TRUE(c.Declare(F32("x/adam", 4)).ok()) << "only the exact slot names are reserved";
}

// Finding 6: a huge element count in tiny chunks made the coordinator build
// billions of chunk records.
TEST_P(HardeningTest, DeclaresBeyondTheLimitsAreRefusedNamingThem) {
  StartCluster(1, 1);
  auto opts = Options(0);
  opts.chunk_bytes = 64;  // the smallest a client allows
  auto c = Client::Connect(opts);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto huge = (*c)->Declare(F32("huge", int64_t{1} << 32));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(huge.status().message(),
                       "over the limit of 65536 a tensor: raise "
                       "chunk_bytes"))
      << huge.status();
  EXPECT_TRUE((*c)->Declare(F32("small", 16)).ok()) << "the coordinator stopped serving";
}

// Finding 7: a declare of f32[2^40] (4 TiB) was accepted, and a create with
// no declare grew a shard by 790 MB. A shard takes creates only while what
// it holds fits its memory (here a 1 MiB limit), checked for a whole batch
// before any chunk of it is made.
TEST_P(HardeningTest, DeclaresBeyondTheShardsMemoryAreRefusedNamingIt) {
  configure_server_ = [](ServerOptions& o) { o.memory_limit_bytes = 1u << 20; };
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto fits = c.Declare(F32("fits", 64 * 1024));  // 256 KiB
  ASSERT_TRUE(fits.ok()) << fits.status();
  TensorSpec adam = F32("adam", 96 * 1024);  // 384 KiB, and 768 KiB of moments
  adam.rule = UpdateRule::kAdam;
  auto refused = c.Declare(adam);
  ASSERT_FALSE(refused.ok()) << "a declare past the shard's memory was accepted";
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(refused.status().message(),
                       "needs 1179648 bytes with its optimizer state; this ps task's host memory "
                       "holds 262144 of the 1048576 it may use"))
      << refused.status();
  auto huge = c.Declare(F32("huge", int64_t{1} << 40));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status();
  EXPECT_EQ(servers_[0]->stats().tensors, 1u) << "a refused batch left chunks behind";
  EXPECT_TRUE(c.Declare(F32("small", 16)).ok()) << "the shard stopped serving";
}

// Finding 17: specs that disagree are refused at connect, naming the
// difference, instead of "could not prove it knows the cluster secret" or a
// late "Internal: coordinator placed a chunk on an unknown shard".
TEST_P(HardeningTest, ClusterSpecMismatchIsRefusedNamingTheDifference) {
  StartCluster(2, 1);
  auto swapped = Options(0);
  swapped.cluster = ClusterSpec();
  auto ps = spec_.tasks("ps");
  ASSERT_TRUE(swapped.cluster.AddJob("ps", {ps[1], ps[0]}).ok());
  ASSERT_TRUE(swapped.cluster.AddJob("worker", spec_.tasks("worker")).ok());
  auto c = Client::Connect(swapped);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status();
  EXPECT_TRUE(Contains(c.status().message(),
                       "ps tasks are [" + ps[0].ToString() + ", " + ps[1].ToString() +
                           "] here but [" + ps[1].ToString() + ", " + ps[0].ToString() + "] there"))
      << c.status();

  auto fewer = Options(0);
  fewer.cluster = ClusterSpec();
  ASSERT_TRUE(fewer.cluster.AddJob("ps", {ps[0]}).ok());
  ASSERT_TRUE(fewer.cluster.AddJob("worker", spec_.tasks("worker")).ok());
  auto c2 = Client::Connect(fewer);
  ASSERT_FALSE(c2.ok());
  EXPECT_TRUE(Contains(c2.status().message(), "here but [" + ps[0].ToString() + "] there"))
      << c2.status();
  EXPECT_TRUE(Client::Connect(Options(0)).ok()) << "the right spec no longer connects";
}

// Finding 2: nothing closed a connection that never authenticated.
TEST_P(HardeningTest, SilentStrangersAreClosedAndCannotCrowdOutWorkers) {
  configure_server_ = [](ServerOptions& o) {
    o.hello_timeout = 300ms;
    o.max_unauthenticated = 2;
  };
  StartCluster(1, 1);
  std::vector<std::unique_ptr<RawPeer>> strangers;
  for (int i = 0; i < 3; ++i) {
    strangers.push_back(Raw(0));
    ASSERT_TRUE(strangers.back()->connected());
  }
  // The third pushed out the first; the deadline closes the other two.
  EXPECT_TRUE(::tessera::testing::WaitUntil(
      [&] { return servers_[0]->stats().connections_refused >= 3; }, 20s))
      << servers_[0]->stats().connections_refused;
  Client& c = Connect(0);
  EXPECT_TRUE(c.Declare(F32("w", 4)).ok());
}

// Finding 18: a port in use was reported as "listen on ...: Device is busy".
TEST_P(HardeningTest, PortInUseIsNamed) {
  if (transport_ == "verbs") GTEST_SKIP() << "verbs listens in rdma_cm's port space, not TCP's";
  StartCluster(1, 1);
  ServerOptions again;
  again.cluster = spec_;
  again.secret = secret_;
  again.transport = transport_;
  auto second = Server::Start(again);
  ASSERT_FALSE(second.ok()) << "two servers on one port";
  EXPECT_TRUE(Contains(second.status().message(), "the port is in use by another process"))
      << second.status();
  EXPECT_TRUE(Contains(second.status().message(), spec_.tasks("ps")[0].ToString()))
      << second.status();
}

// "verbs" runs inside the Soft-RoCE VM only (rdma_vm_suite.sh).
INSTANTIATE_TEST_SUITE_P(Transports, HardeningTest,
                         ::testing::Values("native", "tcp", "posix,sysv,cma,tcp", "verbs"),
                         ClusterTest::Name);

}  // namespace
}  // namespace tessera
