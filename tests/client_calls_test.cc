// What a trainer author asked of the client beyond push and pull, over
// every transport: read-only clients (evaluators, inference readers) and
// what a shard refuses them, control calls made asynchronous and in order,
// calls cancelled before they started, and calls ordered on a CUDA stream
// (which without a GPU must say why they cannot be).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/secret.h"
#include "gpu/cuda.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using testing::ClusterTest;
using testing::RawPeer;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using ClientCallsTest = ClusterTest;

// A reader's options: an evaluator task outside the spec's jobs, holding only
// the reader key.
ClientOptions ReaderOptions(ClientOptions opts) {
  opts.task = {"evaluator", 0};
  opts.read_only = true;
  opts.secret = ReaderKey(opts.secret);
  return opts;
}

TEST_P(ClientCallsTest, ReaderPullsWhatWorkersTrainAndCannotWrite) {
  StartCluster(2, 1);
  Client& chief = Connect(0);
  auto w = chief.Declare(F32("w", 6));
  // 2 MiB in 1 MiB chunks: one on each shard, pulled one-sided.
  auto big = chief.Declare(F32("big", (2 << 20) / 4));
  ASSERT_TRUE(w.ok() && big.ok());
  ASSERT_TRUE(chief.Initialize().ok());
  std::vector<float> g(6, 1.5f), big_g((2 << 20) / 4, -0.25f);
  ASSERT_TRUE(chief.Push({PushItem::Of<float>(*w, g), PushItem::Of<float>(*big, big_g)}).ok());

  Client& reader = Connect(ReaderOptions(Options(0)));
  EXPECT_TRUE(reader.read_only());
  EXPECT_FALSE(reader.is_chief());
  ASSERT_TRUE(reader.WaitForInit(10s).ok());
  // A reader need not know the rule: kAssign here, kAdd where declared.
  auto rw = reader.Declare(F32("w", 6, UpdateRule::kAssign));
  auto rbig = reader.Declare(F32("big", (2 << 20) / 4, UpdateRule::kAssign));
  ASSERT_TRUE(rw.ok()) << rw.status();
  ASSERT_TRUE(rbig.ok()) << rbig.status();
  std::vector<int> shards = reader.info(*rbig)->shards;
  std::sort(shards.begin(), shards.end());
  EXPECT_EQ(shards, (std::vector<int>{0, 1})) << "one chunk on each shard";
  std::vector<float> got(6), big_got((2 << 20) / 4);
  ASSERT_TRUE(
      reader.Pull({PullItem::Of<float>(*rw, got), PullItem::Of<float>(*rbig, big_got)}).ok());
  EXPECT_EQ(got, g);
  EXPECT_EQ(big_got, big_g);
  EXPECT_GT(reader.counters().get_bytes, 0u) << "the large tensor should come one-sided";
  // It sees what the workers push next.
  ASSERT_TRUE(chief.Push({PushItem::Of<float>(*w, g)}).ok());
  ASSERT_TRUE(reader.Pull({PullItem::Of<float>(*rw, got, 3)}).ok());
  EXPECT_EQ(got, std::vector<float>(6, 3.0f));

  // Every write is refused, naming the reader, and sends nothing.
  for (const Status& st :
       {reader.Push({PushItem::Of<float>(*rw, g)}),
        reader.PushPull({{*rw, g.data(), got.data(), 24}}), reader.Initialize(),
        reader.SetHyperparams(*rw, Hyperparams{}), reader.SaveCheckpoint(1s).status()}) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
    EXPECT_TRUE(Contains(st.message(), "/job:evaluator/task:0 is a read-only client")) << st;
  }
  // It finds tensors; it declares none.
  auto unknown = reader.Declare(F32("nowhere", 2));
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(unknown.status().message(), "'nowhere'")) << unknown.status();
  auto wrong = reader.Declare(F32("w", 7));
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(wrong.status().message(), "f32[6]") &&
              Contains(wrong.status().message(), "f32[7]"))
      << wrong.status();
  // Nothing it did changed the parameters.
  std::vector<float> after(6);
  ASSERT_TRUE(chief.Pull({PullItem::Of<float>(*w, after)}).ok());
  EXPECT_EQ(after, std::vector<float>(6, 3.0f));
}

// The reader key lets readers in and nothing else: not a worker, not a shard.
TEST_P(ClientCallsTest, ReaderKeyIsNoWorkersSecret) {
  StartCluster(1, 1);
  ClientOptions worker = Options(0);
  worker.secret = ReaderKey(secret_);
  auto refused = Client::Connect(worker);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(refused.status().message(), "reader key")) << refused.status();

  ServerOptions shard = ServerOptionsFor(0);
  shard.secret = ReaderKey(secret_);
  auto server = Server::Start(shard);
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(Contains(server.status().message(), "reader key")) << server.status();

  // A reader may not take the name of a task of the cluster.
  ClientOptions named_as_worker = ReaderOptions(Options(0));
  named_as_worker.task = {"worker", 0};
  auto misnamed = Client::Connect(named_as_worker);
  EXPECT_EQ(misnamed.status().code(), StatusCode::kInvalidArgument) << misnamed.status();
  // A reader given the whole secret derives the key itself.
  ClientOptions reader = Options(0);
  reader.task = {"reader", 3};
  reader.read_only = true;
  EXPECT_TRUE(Client::Connect(reader).ok());
}

// A reader that speaks the protocol by hand: it gets no memory it may
// write, and every write it asks for is refused without costing it the
// connection.
TEST_P(ClientCallsTest, ShardRefusesAReadersWrites) {
  StartCluster(1, 1);
  Client& chief = Connect(0);
  auto w = chief.Declare(F32("w", 1));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(chief.Initialize().ok());

  std::unique_ptr<RawPeer> raw = Raw(0);
  ASSERT_TRUE(raw->connected());
  wire::Hello hello{wire::PeerRole::kReader, 0, "/job:evaluator/task:0", {}, "", spec_.ToJson()};
  auto welcome = wire::Decode<wire::Welcome>(raw->Authenticate(ReaderKey(secret_), hello));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_TRUE(welcome->staging_region.empty()) << "a reader was given memory to write";

  wire::Declare declare{1u << 20, 1, {}};
  declare.tensors.push_back({"fresh", DType::kF32, UpdateRule::kAssign, {4}, -1, {}, {}});
  wire::Create create;
  create.entries.push_back({declare.tensors[0], 0, 1, 0, 4});
  struct Refused {
    MessageBytes frame;
    StatusCode code;
    const char* says;
  };
  const std::vector<Refused> cases = {
      {wire::Encode(wire::Push{0, {{0, 0, 4}}, {0, 0, 128, 63}}, 10), StatusCode::kPermissionDenied,
       "read-only"},
      {wire::Encode(wire::Push{0, {{0, 0, 4}}, {0, 0, 128, 63}}, 11, wire::kFlagInit),
       StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(wire::SetHyper{{0}, {}}, 12), StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(wire::GetState{0, wire::StateSlotId::kFirst, 0, 4}, 18),
       StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(wire::SetState{0, wire::StateSlotId::kFirst, 0, 1, {1, 2, 3, 4}}, 19),
       StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(wire::InitDone{}, 13), StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(wire::UpdateHyper{"w", {}}, 14), StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(wire::SaveCheckpoint{}, 15), StatusCode::kPermissionDenied, "read-only"},
      {wire::Encode(declare, 16), StatusCode::kNotFound, "'fresh'"},
      {wire::Encode(create, 17), StatusCode::kNotFound, "creates none"},
  };
  for (const auto& c : cases) {
    raw->endpoint().Send(1, c.frame);
    auto err = wire::Decode<wire::Error>(raw->Next());
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_EQ(err->code, c.code) << err->message;
    EXPECT_TRUE(Contains(err->message, c.says)) << err->message;
  }
  raw->Send(wire::Ping{}, 20);
  EXPECT_TRUE(wire::Decode<wire::Ack>(raw->Next()).ok()) << "the connection did not survive";
  std::vector<float> got(1);
  ASSERT_TRUE(chief.Pull({PullItem::Of<float>(*w, got)}).ok());
  EXPECT_EQ(got[0], 0.0f) << "a reader's push changed the value";
  EXPECT_TRUE(chief.Declare(F32("w", 1)).ok());
  EXPECT_EQ(chief.Find("fresh").status().code(), StatusCode::kNotFound);

  // A reader by hand under a worker's name is refused.
  std::unique_ptr<RawPeer> misnamed = Raw(0);
  wire::Hello as_worker = hello;
  as_worker.task = "/job:worker/task:0";
  auto named = wire::Decode<wire::Error>(misnamed->Authenticate(ReaderKey(secret_), as_worker));
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->code, StatusCode::kPermissionDenied);
  EXPECT_TRUE(Contains(named->message, "takes the name of a task")) << named->message;

  // The reader key does not pass for a worker's hello.
  std::unique_ptr<RawPeer> impostor = Raw(0);
  auto denied =
      wire::Decode<wire::Error>(impostor->Authenticate(ReaderKey(secret_), WorkerHello(0)));
  ASSERT_TRUE(denied.ok());
  EXPECT_EQ(denied->code, StatusCode::kPermissionDenied);
}

// Only the chief initialises: another worker's init push would overwrite
// values (and set a sync tensor's step).
TEST_P(ClientCallsTest, InitialisingPushFromANonChiefIsRefused) {
  StartCluster(1, 2);
  Client& chief = Connect(0);
  auto w = chief.Declare(F32("w", 1));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(chief.Initialize().ok());
  std::unique_ptr<RawPeer> raw = Raw(0);
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw->Authenticate(secret_, WorkerHello(1))).ok());
  raw->Send(wire::Push{0, {{0, 0, 4}}, {0, 0, 128, 63}}, 5, wire::kFlagInit);  // 1.0f
  auto err = wire::Decode<wire::Error>(raw->Next());
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_EQ(err->code, StatusCode::kPermissionDenied);
  EXPECT_TRUE(Contains(err->message, "/job:worker/task:1, which is not the chief")) << err->message;
  std::vector<float> got(1);
  ASSERT_TRUE(chief.Pull({PullItem::Of<float>(*w, got)}).ok());
  EXPECT_EQ(got[0], 0.0f);
}

// Control calls queue in order: a worker's wait for init holds the queue,
// so a declare made after it waits too, and can be cancelled there.
TEST_P(ClientCallsTest, ControlCallsRunInOrderAndQueuedOnesCancel) {
  StartCluster(1, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  Future waiting = other.WaitForInitAsync(20s);
  Tensor late;
  Future queued = other.DeclareAsync(F32("late", 4), &late);
  EXPECT_TRUE(queued.Cancel());
  EXPECT_EQ(queued.Wait().code(), StatusCode::kCancelled);
  EXPECT_FALSE(queued.Cancel()) << "cancelled twice";
  EXPECT_FALSE(waiting.ready());

  std::vector<Tensor> declared;
  Future declare = chief.DeclareManyAsync({F32("w", 4), F32("v", 2)}, &declared);
  Future init = chief.InitializeAsync();  // after the declare: it initialises both
  ASSERT_TRUE(init.Wait().ok()) << init.Wait();
  ASSERT_TRUE(declare.ready()) << "the declare ran first";
  ASSERT_EQ(declared.size(), 2u);
  EXPECT_EQ(chief.Find("v")->index, declared[1].index);
  ASSERT_TRUE(waiting.Wait().ok());
  EXPECT_FALSE(waiting.Cancel()) << "a completed call cancelled";

  // The cancelled declare never ran; a new one does.
  EXPECT_EQ(other.Find("late").status().code(), StatusCode::kNotFound);
  Tensor w;
  ASSERT_TRUE(other.DeclareAsync(F32("w", 4), &w).Wait().ok());
  std::vector<float> got(4, 7.0f);
  ASSERT_TRUE(other.Pull({PullItem::Of<float>(w, got)}).ok());
  EXPECT_EQ(got, std::vector<float>(4, 0.0f));
  // An async declare's error arrives through its future.
  Future bad = other.DeclareAsync(F32("w", 5));
  EXPECT_EQ(bad.Wait().code(), StatusCode::kAlreadyExists);
}

// The coordinator's calls in their asynchronous forms (what Python's waits
// use to answer Ctrl-C): on the control queue, in order, cancellable while
// queued, their results written only by a call that completed OK.
TEST_P(ClientCallsTest, CoordinatorCallsMadeAsynchronousRunInTheControlOrder) {
  StartCluster(1, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  Future waiting = other.WaitForInitAsync(20s);
  uint64_t step = 99;
  Future queued = other.GlobalStepAsync(&step);  // behind the wait
  EXPECT_TRUE(queued.Cancel());
  EXPECT_EQ(queued.Wait().code(), StatusCode::kCancelled);
  EXPECT_EQ(step, 99u) << "a cancelled call wrote its result";

  std::vector<Tensor> w;
  Future declare = chief.DeclareManyAsync({F32("w", 4, UpdateRule::kSgd)}, &w);
  Future init = chief.InitializeAsync();
  Hyperparams hyper;
  hyper.learning_rate = 0.25f;
  Future set = chief.SetHyperparamsAsync(Tensor{}, hyper);  // no tensor yet: refused
  ASSERT_TRUE(init.Wait().ok()) << init.Wait();
  EXPECT_FALSE(set.Wait().ok());
  ASSERT_EQ(w.size(), 1u);
  ASSERT_TRUE(chief.SetHyperparamsAsync(w[0], hyper).Wait().ok());
  EXPECT_EQ(chief.info(w[0])->hyper.learning_rate, 0.25f);
  // Not the chief: refused through the future, as the blocking call is.
  Tensor other_w;
  ASSERT_TRUE(other.DeclareAsync(F32("w", 4, UpdateRule::kSgd), &other_w).Wait().ok());
  EXPECT_EQ(other.SetHyperparamsAsync(other_w, hyper).Wait().code(),
            StatusCode::kFailedPrecondition);

  ASSERT_TRUE(waiting.Wait().ok());
  ASSERT_TRUE(other.GlobalStepAsync(&step).Wait().ok());
  EXPECT_EQ(step, *other.GlobalStep());
  EXPECT_TRUE(other.GlobalStepAsync(nullptr).Wait().ok()) << "a null result is allowed";
  // This cluster's coordinator has no checkpoint directory: the refusal
  // comes through the future, and `saved` is left as it was.
  Client::CheckpointInfo saved{7, "untouched"};
  Status refused = chief.SaveCheckpointAsync(&saved, 10s).Wait();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(Contains(refused.message(), "checkpoint directory")) << refused;
  EXPECT_EQ(saved.global_step, 7u);
  EXPECT_EQ(saved.path, "untouched");
}

// A data call waits to start while the progress thread is busy: cancelled
// then, its bytes never move. The test holds the progress thread in a
// continuation (which real code must never do) to make "not started" last.
TEST_P(ClientCallsTest, DataCallCancelledBeforeItStartsMovesNothing) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto w = c.Declare(F32("w", 4));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> seen(4);
  // A pull of version 2 waits at the shard until the push below.
  Future held = c.PullAsync({PullItem::Of<float>(*w, seen, 2)});
  std::mutex mu;
  std::condition_variable cv;
  bool in_continuation = false, release = false;
  held.Then([&](const Status&) {
    std::unique_lock<std::mutex> lock(mu);
    in_continuation = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  std::vector<float> one(4, 1.0f), nine(4, 9.0f);
  Future first = c.PushAsync({PushItem::Of<float>(*w, one)});
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return in_continuation; }));
  }
  // The progress thread is inside the continuation: this push waits to start.
  Future cancelled = c.PushAsync({PushItem::Of<float>(*w, nine)});
  EXPECT_TRUE(cancelled.Cancel());
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_EQ(cancelled.Wait().code(), StatusCode::kCancelled);
  ASSERT_TRUE(first.Wait().ok());
  ASSERT_TRUE(held.Wait().ok());
  std::vector<float> got(4);
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, got)}).ok());
  EXPECT_EQ(got, one) << "the cancelled push was applied";
  EXPECT_FALSE(first.Cancel());
}

// Without a usable GPU a stream-ordered call fails saying why, and moves
// nothing; with one, gpu_shard_test's StreamOrderedPushAndPull runs it.
TEST_P(ClientCallsTest, StreamOrderedCallWithoutAGpuSaysWhy) {
  if (gpu::Available().ok()) GTEST_SKIP() << "a GPU is usable here: gpu-shard tests the stream";
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto w = c.Declare(F32("w", 2));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> one(2, 1.0f), got(2);
  int not_a_stream = 0;  // never reached: there is no CUDA to hand it to
  const CallOptions on{&not_a_stream};
  for (Future f : {c.PushAsync({PushItem::Of<float>(*w, one)}, {.call = on}),
                   c.PullAsync({PullItem::Of<float>(*w, got)}, on),
                   c.PushPullAsync({{*w, one.data(), got.data(), 8}}, on)}) {
    Status st = f.Wait();
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(Contains(st.message(), "CUDA") || Contains(st.message(), "GPU")) << st;
  }
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, got)}).ok());
  EXPECT_EQ(got, std::vector<float>(2, 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientCallsTest,
                         ::testing::Values("native", "tcp", "posix,sysv,cma,tcp", "verbs"),
                         ClusterTest::Name);

}  // namespace
}  // namespace tessera
