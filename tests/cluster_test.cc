// Shards and workers in one process (separate transport contexts, real UCX
// connections): placement, chunking, consistency of pulls, and every error
// case the foundation promises to report clearly.
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

TEST_P(ClusterTest, BadPushesAreRefusedAndNothingElseBreaks) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto w = c.Declare(F32("w", 4));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> three(3, 1.0f);
  Status st = c.Push({PushItem::Of<float>(*w, three)});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("16 bytes"), std::string::npos) << st.ToString();
  std::vector<double> wrong_dtype(2, 1.0);  // 16 bytes, but f64
  st = c.Push({PushItem::Of<double>(*w, wrong_dtype)});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("f32[4], not f64"), std::string::npos) << st.ToString();
  st = c.Push({{Tensor{77}, three.data(), 12, std::nullopt}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Find("nope").status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.Find("nope").status().message().find("'nope'"), std::string::npos);
  // Still serving.
  std::vector<float> ones(4, 1.0f), got(4);
  ASSERT_TRUE(c.Push({PushItem::Of<float>(*w, ones)}).ok());
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, got, 2)}).ok());
  EXPECT_EQ(got, ones);
}

// retry_lost_shard_within is checked before anything connects: a bound
// past op_timeout (every wait would end first), a negative one, and a bad
// TESSERA_RETRY_LOST_SHARD_MS are refused, naming them.
TEST_P(ClusterTest, ARetryBoundThatCannotWorkIsRefused) {
  NewSpec(1, 1);
  ClientOptions o = Options(0);
  o.op_timeout = 2s;
  o.retry_lost_shard_within = 3s;
  auto bad = Client::Connect(o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("retry_lost_shard_within (3000 ms) exceeds op_timeout"),
            std::string::npos)
      << bad.status();
  o.retry_lost_shard_within = -1ms;
  bad = Client::Connect(o);
  EXPECT_NE(bad.status().message().find("retry_lost_shard_within is -1 ms"), std::string::npos)
      << bad.status();
  o.retry_lost_shard_within = 0ms;
  setenv("TESSERA_RETRY_LOST_SHARD_MS", "ten", 1);
  bad = Client::Connect(o);
  unsetenv("TESSERA_RETRY_LOST_SHARD_MS");
  EXPECT_NE(bad.status().message().find("TESSERA_RETRY_LOST_SHARD_MS='ten'"), std::string::npos)
      << bad.status();
}

// ReadOptimizerState / WriteOptimizerState (a trainer's state_dict): the
// momentum buffer of a tensor in three chunks on two shards, read whole in
// the tensor's order, written by the chief and used by the next update;
// refused, naming why, for a slot the rule does not keep, a wrong size and
// a worker that is not the chief.
TEST_P(ClusterTest, OptimizerStateIsReadAndWrittenWhole) {
  chunk_bytes_ = 64;  // 16 elements a chunk: 40 elements in 3 chunks
  StartCluster(2, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  TensorSpec spec{"m", DType::kF32, {40}, UpdateRule::kMomentum, {}, -1};
  spec.hyper.learning_rate = 0.5f;
  spec.hyper.momentum = 0.5f;
  auto m = chief.Declare(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_EQ(chief.info(*m)->shards.size(), 3u);
  auto m_other = other.Declare(spec);  // a handle is its client's
  ASSERT_TRUE(m_other.ok()) << m_other.status();
  std::vector<float> grad(40);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(chief.Push({PushItem::Of<float>(*m, grad)}).ok());
  }
  auto read = [&](Client& c, Tensor t) {
    auto st = c.ReadOptimizerState(t, Client::StateSlot::kFirst);
    EXPECT_TRUE(st.ok()) << st.status();
    std::vector<float> b(40);
    if (st.ok() && st->bytes.size() == 160) std::memcpy(b.data(), st->bytes.data(), 160);
    return std::make_pair(b, st.ok() ? st->updates : 0);
  };
  // b = 0.5 b + g, three times: 1.75 g.
  auto [b, updates] = read(other, *m_other);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(b[i], 1.75f * static_cast<float>(i)) << i;
  EXPECT_EQ(updates, 3u);

  Client::OptimizerState set;
  set.bytes.resize(160);
  const std::vector<float> tens(40, 10.0f);
  std::memcpy(set.bytes.data(), tens.data(), 160);
  set.updates = 7;
  ASSERT_TRUE(chief.WriteOptimizerState(*m, Client::StateSlot::kFirst, set).ok());
  ASSERT_TRUE(chief.Push({PushItem::Of<float>(*m, grad)}).ok());
  std::tie(b, updates) = read(chief, *m);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(b[i], 5.0f + static_cast<float>(i)) << i;
  EXPECT_EQ(updates, 8u);

  Status st = other.WriteOptimizerState(*m_other, Client::StateSlot::kFirst, set);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("not the chief"), std::string::npos) << st;
  set.bytes.resize(156);
  st = chief.WriteOptimizerState(*m, Client::StateSlot::kFirst, set);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("156 bytes for a slot of 160"), std::string::npos) << st;
  auto none = chief.ReadOptimizerState(*m, Client::StateSlot::kSecond);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status();
  EXPECT_NE(none.status().message().find("(momentum, f32) keeps no state slot 1"),
            std::string::npos)
      << none.status();
}

// A Tensor kept from a closed client names no tensor of the next client,
// which holds another tensor at the same index: refused, not pulled.
TEST_P(ClusterTest, AClosedClientsHandleIsRefusedByTheNextClient) {
  StartCluster(1, 1);
  auto first = Client::Connect(Options(0)).value();
  Tensor a = first->Declare(F32("a", 4)).value();
  ASSERT_TRUE(first->Initialize().ok());
  first.reset();
  Client& next = Connect(0);
  Tensor b = next.Declare(F32("b", 4)).value();
  ASSERT_EQ(b.index, a.index);  // the same number: only the client tells them apart
  ASSERT_TRUE(next.Initialize().ok());
  std::vector<float> got(4);
  Status st = next.Pull({PullItem::Of<float>(a, got)});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("belongs to another client"), std::string::npos) << st;
  st = next.Push({PushItem::Of<float>(a, std::span<const float>(got))});
  EXPECT_NE(st.message().find("belongs to another client"), std::string::npos) << st;
  EXPECT_NE(next.info(a).status().message().find("another client"), std::string::npos);
  st = next.Pull({PullItem::Of<float>(Tensor{}, got)});
  EXPECT_NE(st.message().find("not declared by any client"), std::string::npos) << st;
  EXPECT_TRUE(next.Pull({PullItem::Of<float>(b, got)}).ok());
  EXPECT_EQ(next.Find("b").value().client, next.id());
}

TEST_P(ClusterTest, PushBeforeInitIsRefused) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto w = c.Declare(F32("w", 2));
  std::vector<float> v(2);
  Status st = c.Push({PushItem::Of<float>(*w, v)});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("not initialised"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("ps task 0"), std::string::npos) << st.ToString();
}

TEST_P(ClusterTest, ShardMissingAtStartIsNamed) {
  StartCluster(2, 1, /*running=*/1);
  auto opts = Options(0);
  opts.startup_timeout = 1500ms;
  opts.report_interval = 500ms;
  auto start = std::chrono::steady_clock::now();
  auto c = Client::Connect(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.status().message().find("/job:ps/task:1"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find(spec_.tasks("ps")[1].ToString()), std::string::npos);
  EXPECT_EQ(c.status().message().find("/job:ps/task:0"), std::string::npos) << "ps 0 was up";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A worker started before a ps task says whom it waits for, at its first
// failed attempt, and how long it will keep trying, once: not every 5 s.
TEST_P(ClusterTest, AMissingShardIsReportedOnceAtOnce) {
  StartCluster(2, 1, /*running=*/1);
  auto opts = Options(0);
  opts.startup_timeout = 2500ms;
  ::testing::internal::CaptureStderr();
  auto c = Client::Connect(opts);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(c.ok());
  size_t said = 0;
  for (size_t at = log.find("waiting up to "); at != std::string::npos;
       at = log.find("waiting up to ", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << log;
  EXPECT_NE(log.find("s more for ps tasks (they may start in any order): /job:ps/task:1 (" +
                     spec_.tasks("ps")[1].ToString() + ")"),
            std::string::npos)
      << log;
}

// ClientOptions::interrupted ends the wait for a missing ps task (how the
// Python binding answers Ctrl-C there), naming whom it waited for.
TEST_P(ClusterTest, AnInterruptedConnectStopsWaiting) {
  StartCluster(2, 1, /*running=*/1);
  auto opts = Options(0);
  opts.startup_timeout = 60s;
  std::atomic<int> asked{0};
  opts.interrupted = [&] { return ++asked > 3; };
  const auto start = std::chrono::steady_clock::now();
  auto c = Client::Connect(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCancelled) << c.status();
  EXPECT_NE(c.status().message().find("/job:ps/task:1"), std::string::npos) << c.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// A task at `at` that takes connections and never answers them: what a
// connection its server dropped unseen looks like from the other side.
struct SilentListener {
  SilentListener(const std::string& backend, const TaskAddress& at) {
    auto ctx = transport::Context::Open({.backend = backend});
    if (!ctx.ok()) {
      status = ctx.status();
      return;
    }
    context = std::move(*ctx);
    auto l =
        context->Listen(at.host, at.port, [this](const std::shared_ptr<transport::Endpoint>& ep) {
          std::lock_guard<std::mutex> lock(mu);
          taken.push_back(ep);
        });
    if (!l.ok()) {
      status = l.status();
      return;
    }
    listener = std::move(*l);
  }
  ~SilentListener() {
    listener.reset();
    std::lock_guard<std::mutex> lock(mu);
    for (auto& ep : taken) ep->Close();
  }
  size_t Taken() {
    std::lock_guard<std::mutex> lock(mu);
    return taken.size();
  }
  Status status;
  std::unique_ptr<transport::Context> context;
  std::unique_ptr<transport::Listener> listener;
  std::mutex mu;
  std::vector<std::shared_ptr<transport::Endpoint>> taken;  // kept open, never answered
};

// A task at a shard's address that takes the connection but never answers
// the handshake (what a connection the shard dropped unseen looks like)
// does not hold the worker: after the hello deadline it connects again, and
// when the start-up time is up it names what happened. Before, it waited
// for that answer until the start-up time ran out, and a shard that was
// fine a moment later was never tried again.
TEST_P(ClusterTest, AShardThatNeverAnswersTheHandshakeIsConnectedToAgain) {
  StartCluster(2, 1, /*running=*/1);
  const TaskAddress silent_at = spec_.tasks("ps")[1];
  SilentListener silent(transport_, silent_at);
  ASSERT_TRUE(silent.status.ok()) << silent.status.ToString();
  const double scale = TimeoutScale().value();
  setenv("TESSERA_HELLO_TIMEOUT_MS", "300", 1);
  auto opts = Options(0);
  opts.startup_timeout = std::chrono::milliseconds(static_cast<int64_t>(3000 * scale));
  auto c = Client::Connect(opts);
  unsetenv("TESSERA_HELLO_TIMEOUT_MS");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status().ToString();
  EXPECT_NE(
      c.status().message().find("/job:ps/task:1 (" + silent_at.ToString() +
                                "): took the connection but did not finish the handshake within"),
      std::string::npos)
      << c.status().ToString();
  EXPECT_EQ(c.status().message().find("/job:ps/task:0"), std::string::npos) << "ps 0 was up";
  EXPECT_GE(silent.Taken(), 2u) << "the worker never connected again";
}

// A listener at a ps task's address that answers, but not as Tessera's tcp
// transport does (an ssh server's banner here), will never become a ps
// task: the worker fails at once, naming it, instead of trying again every
// 300 ms until its start-up time (60 s) runs out.
TEST_P(ClusterTest, AListenerThatIsNotTesserasFailsTheStartAtOnce) {
  if (transport_ != "tcp") GTEST_SKIP() << "UCX's own connection manager answers for UCX";
  StartCluster(2, 1, /*running=*/1);
  const TaskAddress at = spec_.tasks("ps")[1];
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(at.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << strerror(errno);
  ASSERT_EQ(listen(fd, 16), 0);
  std::atomic<bool> done{false};
  std::thread banner([&] {
    std::vector<int> taken;
    while (!done) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      const char kBanner[] = "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n";
      [[maybe_unused]] ssize_t n = send(c, kBanner, sizeof kBanner - 1, MSG_NOSIGNAL);
      taken.push_back(c);
    }
    for (int c : taken) close(c);
  });
  auto opts = Options(0);
  opts.startup_timeout = 60s;
  const auto start = std::chrono::steady_clock::now();
  auto c = Client::Connect(opts);
  const auto took = std::chrono::steady_clock::now() - start;
  done = true;
  banner.join();
  close(fd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find(at.ToString() + " does not speak Tessera's tcp transport"),
            std::string::npos)
      << c.status();
  EXPECT_LT(took, 30s) << "waited out the start-up time";
}

// The same for a ps task joining the coordinator: a coordinator that takes
// the connection and never answers is connected to again after the hello
// deadline, instead of being waited for as long as the task runs.
TEST_P(ClusterTest, ACoordinatorThatNeverAnswersTheHandshakeIsConnectedToAgain) {
  AddPsAndWorkers(2, 1);
  const TaskAddress silent_at = spec_.tasks("ps")[0];  // where the coordinator would be
  SilentListener silent(transport_, silent_at);
  ASSERT_TRUE(silent.status.ok()) << silent.status.ToString();
  setenv("TESSERA_HELLO_TIMEOUT_MS", "300", 1);
  auto server = Server::Start(ServerOptionsFor(1));
  unsetenv("TESSERA_HELLO_TIMEOUT_MS");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const bool again = testing::WaitUntil(
      [&] { return silent.Taken() >= 2; },
      std::chrono::milliseconds(static_cast<int64_t>(20'000 * TimeoutScale().value())));
  (*server)->Stop();
  EXPECT_TRUE(again) << "the ps task never connected to the coordinator again";
}

TEST_P(ClusterTest, WrongSecretIsRefusedAndOthersKeepWorking) {
  StartCluster(1, 2);
  auto opts = Options(1);
  opts.secret = "not the cluster secret, but as long";
  auto bad = Client::Connect(opts);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(bad.status().message().find("/job:ps/task:0"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("secret"), std::string::npos);
  // The list of refusals starts with the first (a stray "; " led it).
  EXPECT_EQ(bad.status().message().rfind("cannot join the cluster: /job:ps/task:0 (", 0), 0u)
      << bad.status().ToString();

  Client& good = Connect(0);
  auto w = good.Declare(F32("w", 1));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(good.Initialize().ok());
}

// A peer that asks for tensors without authenticating is refused and
// disconnected; the shard keeps serving the others.
TEST_P(ClusterTest, RequestsBeforeAuthenticationAreRefused) {
  StartCluster(1, 1);
  Client& good = Connect(0);
  auto w = good.Declare(F32("w", 1));
  ASSERT_TRUE(good.Initialize().ok());

  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  raw.Send(wire::Pull{{{0, 0}}}, 9);
  auto refused = wire::Decode<wire::Error>(raw.Next());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->code, StatusCode::kPermissionDenied);
  EXPECT_TRUE(
      testing::WaitUntil([&] { return servers_[0]->stats().connections_refused >= 1; }, 10s));

  std::vector<float> one(1, 1.0f), got(1);
  ASSERT_TRUE(good.Push({PushItem::Of<float>(*w, one)}).ok());
  ASSERT_TRUE(good.Pull({PullItem::Of<float>(*w, got, 2)}).ok());
  EXPECT_EQ(got[0], 1.0f);
}

// A peer that speaks the protocol but forges its proof gets no memory key.
// `tessera status` connects as an observer: it gets status and nothing else.
TEST_P(ClusterTest, ObserversMayOnlyAskForStatus) {
  StartCluster(1, 1);
  RawPeer observer(spec_.address({"ps", 0}).value(), transport_);
  ASSERT_TRUE(observer.connected());
  auto welcome = wire::Decode<wire::Welcome>(
      observer.Authenticate(secret_, {wire::PeerRole::kObserver, 0, "/job:status/task:0"}));
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  EXPECT_TRUE(welcome->staging_region.empty()) << "an observer was given memory";
  observer.Send(wire::Push{0, {{0, 0, 4}}, {1, 2, 3, 4}}, 7);
  auto refused = wire::Decode<wire::Error>(observer.Next());
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->code, StatusCode::kPermissionDenied);
  EXPECT_NE(refused->message.find("may only ask for status"), std::string::npos)
      << refused->message;
  observer.Send(wire::StatusRequest{}, 8);
  auto status = wire::Decode<wire::StatusReply>(observer.Next());
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->json.find("\"task\":\"/job:ps/task:0\""), std::string::npos) << status->json;
  // Workers still work beside it.
  Client& c = Connect(0);
  EXPECT_TRUE(c.Declare({"w", DType::kF32, {4}, UpdateRule::kAssign, {}, -1}).ok());
}

TEST_P(ClusterTest, BadProofIsRefused) {
  StartCluster(1, 1);
  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  auto reply = raw.Authenticate("a guess", WorkerHello(0));
  auto err = wire::Decode<wire::Error>(reply);
  ASSERT_TRUE(err.ok()) << "expected an error, got " << reply.size() << " bytes";
  EXPECT_EQ(err->code, StatusCode::kPermissionDenied);
  EXPECT_NE(err->message.find("secret"), std::string::npos) << err->message;
  EXPECT_FALSE(wire::Decode<wire::Welcome>(reply).ok());
  EXPECT_GE(servers_[0]->stats().connections_refused, 1u);
}

// A worker that takes a pull lease and never gives it back cannot block the
// tensor's updates: the lease is revoked after lease_timeout.
TEST_P(ClusterTest, StalledLeaseIsRevoked) {
  lease_timeout_ = 300ms;
  StartCluster(1, 2);
  Client& c = Connect(0);
  auto w = c.Declare(F32("w", 4));
  ASSERT_TRUE(c.Initialize().ok());

  RawPeer raw(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(wire::Decode<wire::Welcome>(raw.Authenticate(secret_, WorkerHello(1))).ok());
  raw.Send(wire::Pull{{{0, 1}}}, 3);  // key 0 is "w": the only tensor
  auto lease = wire::Decode<wire::PullReply>(raw.Next());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();

  std::vector<float> ones(4, 1.0f);
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.Push({PushItem::Of<float>(*w, ones)}).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms) << "the update waited for the lease";
  EXPECT_EQ(servers_[0]->stats().leases_revoked, 1u);
}

TEST_P(ClusterTest, LargeTensorMovesOneSided) {
  StartCluster(1, 1);
  auto opts = Options(0);
  opts.chunk_bytes = 4u << 20;  // the default: 16 chunks, each one put and one get
  auto cr = Client::Connect(opts);
  ASSERT_TRUE(cr.ok());
  Client& c = **cr;
  const size_t n = (64u << 20) / 4;
  auto w = c.Declare({"big", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAssign, {}, -1});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> data(n), back(n);
  std::iota(data.begin(), data.end(), 0.5f);
  auto before = c.counters();
  ASSERT_TRUE(c.Push({PushItem::Of<float>(*w, data)}).ok());
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, back, 2)}).ok());
  auto after = c.counters();
  EXPECT_TRUE(data == back);
  EXPECT_EQ(after.put_bytes - before.put_bytes, n * 4) << "payload went one-sided, once";
  EXPECT_EQ(after.get_bytes - before.get_bytes, n * 4);
  EXPECT_EQ(after.puts - before.puts, 16u);
  EXPECT_EQ(after.gets - before.gets, 16u);
  EXPECT_LT(after.message_bytes_sent - before.message_bytes_sent, 2048u)
      << "no payload in messages";
  EXPECT_LT(after.message_bytes_received - before.message_bytes_received, 2048u);
}

// Small pushes and pulls carry their bytes in the messages (one round trip,
// no put, get, flush or lease); a batch above inline_bytes goes one-sided.
TEST_P(ClusterTest, SmallTensorsTravelInline) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto t = c.DeclareMany({F32("a", 3), F32("b", 500), F32("big", 4096)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> a = {1, 2, 3}, b(500, 0.5f), big(4096, 2.0f), ga(3), gb(500), gbig(4096);
  auto before = c.counters();
  ASSERT_TRUE(c.Push({PushItem::Of<float>((*t)[0], a), PushItem::Of<float>((*t)[1], b)}).ok());
  ASSERT_TRUE(
      c.Pull({PullItem::Of<float>((*t)[0], ga, 2), PullItem::Of<float>((*t)[1], gb, 2)}).ok());
  auto after = c.counters();
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
  EXPECT_EQ(after.puts, before.puts) << "2012 bytes travel inline";
  EXPECT_EQ(after.gets, before.gets);
  EXPECT_GT(after.message_bytes_sent - before.message_bytes_sent, 2012u);
  ASSERT_TRUE(c.Push({PushItem::Of<float>((*t)[2], big)}).ok());  // 16 KiB: one-sided
  ASSERT_TRUE(c.Pull({PullItem::Of<float>((*t)[2], gbig, 2)}).ok());
  EXPECT_EQ(gbig, big);
  auto last = c.counters();
  EXPECT_EQ(last.puts - after.puts, 1u);
  EXPECT_EQ(last.gets - after.gets, 1u);
}

// Small tensors above the inline limit go one-sided; where the fabric says a
// put or get costs more than a copy (GatherUpTo), the ones next to each
// other in the staging slot are gathered into one put, and the ones next to
// each other in the shard's arena come back in one get. Every byte must
// still land where its own tensor's entry says, padding and all: sizes that
// are not a multiple of the 64-byte alignment, a large tensor that breaks
// the run, a second push that adds to the first, and pulls that leave
// tensors out of the run or ask for them backwards.
TEST_P(ClusterTest, SmallTensorsAboveTheInlineLimitArriveWhole) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 41; ++i) {
    const int64_t n = i == 20 ? 16384 : i < 20 ? 1001 : 1024;  // 4004 B, 64 KiB, 4 KiB
    specs.push_back(F32("t" + std::to_string(i), n));
  }
  auto t = c.DeclareMany(specs);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<std::vector<float>> grads(specs.size()), back(specs.size());
  std::vector<PushItem> push;
  std::vector<PullItem> pull;
  for (size_t i = 0; i < specs.size(); ++i) {
    grads[i].resize(static_cast<size_t>(specs[i].shape[0]));
    for (size_t k = 0; k < grads[i].size(); ++k) grads[i][k] = static_cast<float>(i * 10000 + k);
    back[i].resize(grads[i].size());
    push.push_back(PushItem::Of<float>((*t)[i], grads[i]));
    pull.push_back(PullItem::Of<float>((*t)[i], back[i], 2));
  }
  auto before = c.counters();
  ASSERT_TRUE(c.Push(push).ok());
  auto after = c.counters();
  ASSERT_TRUE(c.Push(push).ok());
  auto pushed = c.counters();
  ASSERT_TRUE(c.Pull(pull).ok());
  auto pulled = c.counters();
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], 2 * grads[i][k]) << "tensor " << i << ", element " << k;
    }
  }
  // Every third tensor (the gaps between them are read and dropped), then
  // all of them backwards (no run at all), into poisoned buffers.
  std::vector<PullItem> thirds, backwards;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::fill(back[i].begin(), back[i].end(), -1.0f);
    if (i % 3 == 0) thirds.push_back(pull[i]);
  }
  ASSERT_GE(thirds.size() * 4000, ClientOptions{}.inline_bytes) << "the pull must go one-sided";
  ASSERT_TRUE(c.Pull(thirds).ok());
  auto pulled_thirds = c.counters();
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], i % 3 == 0 ? 2 * grads[i][k] : -1.0f)
          << "every third tensor: tensor " << i << ", element " << k;
    }
    std::fill(back[i].begin(), back[i].end(), -1.0f);
  }
  backwards.assign(pull.rbegin(), pull.rend());
  ASSERT_TRUE(c.Pull(backwards).ok());
  auto pulled_backwards = c.counters();
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], 2 * grads[i][k]) << "backwards: tensor " << i << ", element " << k;
    }
  }
  const uint64_t all_gets = pulled.gets - pushed.gets;
  const uint64_t thirds_gets = pulled_thirds.gets - pulled.gets;
  const uint64_t backwards_gets = pulled_backwards.gets - pulled_thirds.gets;
  if (std::string(GetParam()) == "native") {
    // Tessera's sockets gather chunks up to 16 KiB: the first run, the
    // large tensor alone, the second run; for every third tensor the large
    // one's gap breaks the run in two.
    EXPECT_EQ(after.puts - before.puts, 3u);
    EXPECT_EQ(all_gets, 3u);
    EXPECT_EQ(thirds_gets, 2u);
  } else {
    EXPECT_EQ(after.puts - before.puts, specs.size()) << "UCX puts each chunk where it is";
    EXPECT_EQ(all_gets, specs.size()) << "UCX gets each chunk where it is";
    EXPECT_EQ(thirds_gets, thirds.size());
  }
  EXPECT_EQ(backwards_gets, specs.size()) << "chunks asked for backwards form no run";
}

// A push larger than the worker's staging slot on a shard (16 MiB here)
// goes in parts, one after another, each within the slot: every tensor
// arrives whole, and the sync step counts once, whatever the parts.
TEST_P(ClusterTest, APushLargerThanTheStagingSlotGoesInParts) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 7; ++i) {
    specs.push_back(F32("t" + std::to_string(i), i == 3 ? 1000 : (1 << 20) - 16 * i));
    specs.back().mode = ConsistencyMode::Sync(1, 1, /*average=*/false);
  }
  auto t = c.DeclareMany(specs);  // about 24 MiB: two parts
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<std::vector<float>> grads(specs.size()), back(specs.size());
  std::vector<PushItem> push;
  std::vector<PullItem> pull;
  for (size_t i = 0; i < specs.size(); ++i) {
    grads[i].resize(static_cast<size_t>(specs[i].shape[0]));
    for (size_t k = 0; k < grads[i].size(); ++k) grads[i][k] = static_cast<float>(i * 7 + k % 1000);
    back[i].resize(grads[i].size());
    push.push_back(PushItem::Of<float>((*t)[i], grads[i]));
    pull.push_back(PullItem::Of<float>((*t)[i], back[i]));
  }
  for (uint64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(c.Push(push, step).ok()) << "step " << step;
    for (auto& p : pull) p.min_step = step + 1;
    ASSERT_TRUE(c.Pull(pull).ok()) << "step " << step;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], 2 * grads[i][k]) << "tensor " << i << ", element " << k;
    }
  }
  EXPECT_EQ(EventualGlobalStep(c, 2), 2u);
}

TEST_P(ClusterTest, ChunksLargerThanTheStagingSlotAreRefusedAtConnect) {
  StartCluster(1, 1);
  auto opts = Options(0);
  opts.chunk_bytes = 64u << 20;  // the shards' slots hold 16 MiB
  auto c = Client::Connect(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("chunk_bytes"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("staging"), std::string::npos) << c.status().ToString();
}

// Each update adds 1 to every element, so any pulled buffer must be uniform:
// a mix of two values would be a half-applied update.
TEST_P(ClusterTest, PullNeverSeesAHalfAppliedUpdate) {
  StartCluster(1, 2);
  Client& writer = Connect(0);
  Client& reader = Connect(1);
  const size_t n = (2u << 20) / 4;
  auto w = writer.Declare({"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1});
  auto r = reader.Declare({"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1});
  ASSERT_TRUE(w.ok() && r.ok());
  ASSERT_TRUE(writer.Initialize().ok());
  ASSERT_TRUE(reader.WaitForInit(5s).ok());
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::vector<float> ones(n, 1.0f);
    while (!stop) ASSERT_TRUE(writer.Push({PushItem::Of<float>(*w, ones)}).ok());
  });
  std::vector<float> got(n);
  int torn = 0;
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(reader.Pull({PullItem::Of<float>(*r, got)}).ok());
    if (std::any_of(got.begin(), got.end(), [&](float x) { return x != got[0]; })) torn++;
  }
  stop = true;
  pusher.join();
  EXPECT_EQ(torn, 0);
}

TEST_P(ClusterTest, LostShardFailsCallsNamingIt) {
  StartCluster(2, 1);
  Client& c = Connect(0);
  auto t = c.DeclareMany({F32("a", 4), F32("b", 4)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c.Initialize().ok());
  servers_[1]->Stop();
  std::vector<float> v(4), got(4);
  Status st;
  for (int i = 0; i < 50; ++i) {  // the loss may take a moment to be noticed
    st = c.Push({PushItem::Of<float>((*t)[1], v)});
    if (!st.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/job:ps/task:1"), std::string::npos) << st.ToString();
  // The other shard still serves.
  EXPECT_TRUE(c.Push({PushItem::Of<float>((*t)[0], v)}).ok());
}

// More pushes in flight than the staging slot holds: they queue for space and
// every one is applied exactly once.
TEST_P(ClusterTest, ConcurrentPushesQueueForStagingSpace) {
  StartCluster(1, 1);  // 16 MiB slots
  Client& c = Connect(0);
  const size_t n = (3u << 20) / 4;  // 3 MiB: at most 5 fit at once
  auto w = c.Declare({"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> ones(n, 1.0f);
  std::vector<Future> futures;
  for (int i = 0; i < 16; ++i) futures.push_back(c.PushAsync({PushItem::Of<float>(*w, ones)}));
  for (auto& f : futures) ASSERT_TRUE(f.Wait().ok());
  std::vector<float> got(n);
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, got, 17)}).ok());
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return x == 16.0f; }));
}

// Through the whole path (staging slot, push-done, kernel, pull), SGD in f64
// matches the reference computed here bit for bit, including a learning-rate
// change by the chief halfway.
TEST_P(ClusterTest, SgdOnTheShardMatchesReferenceExactly) {
  StartCluster(2, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  const size_t n = 300000;  // 2.4 MB: chunked over both shards
  TensorSpec spec{"w", DType::kF64, {static_cast<int64_t>(n)}, UpdateRule::kSgd, {}, -1};
  spec.hyper.learning_rate = 0.1f;
  spec.hyper.weight_decay = 0.01f;
  std::vector<double> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i] = std::sin(static_cast<double>(i));
  spec.initial.resize(n * 8);
  std::memcpy(spec.initial.data(), ref.data(), n * 8);
  auto w = chief.Declare(spec);
  auto w2 = other.Declare(spec);
  ASSERT_TRUE(w.ok() && w2.ok());
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_TRUE(other.WaitForInit(5s).ok());
  EXPECT_EQ(other.SetHyperparams(*w2, spec.hyper).code(), StatusCode::kFailedPrecondition);

  std::vector<double> g(n);
  double lr = 0.1, wd = static_cast<double>(0.01f);
  for (int step = 1; step <= 6; ++step) {
    if (step == 4) {
      Hyperparams h = spec.hyper;
      h.learning_rate = 0.05f;
      ASSERT_TRUE(chief.SetHyperparams(*w, h).ok());
      lr = static_cast<double>(0.05f);
    } else if (step == 1) {
      lr = static_cast<double>(0.1f);
    }
    for (size_t i = 0; i < n; ++i) g[i] = std::cos(static_cast<double>(i * step));
    Client& c = step % 2 ? chief : other;
    ASSERT_TRUE(c.Push({PushItem::Of<double>(step % 2 ? *w : *w2, g)}).ok());
    for (size_t i = 0; i < n; ++i) ref[i] -= lr * (g[i] + wd * ref[i]);
  }
  std::vector<double> got(n);
  ASSERT_TRUE(chief.Pull({PullItem::Of<double>(*w, got, 7)}).ok());
  EXPECT_TRUE(got == ref) << "first element " << got[0] << " vs " << ref[0];
}

// ChunkPart: two workers each push and pull their own chunks of a tensor
// (what NodeGroup's ranks do); the others are left alone.
TEST_P(ClusterTest, ChunkPartsMoveOnlyTheirChunks) {
  StartCluster(2, 2);
  Client& a = Connect(0);
  Client& b = Connect(1);
  const size_t n = 1u << 20;  // 4 MiB: 4 chunks of 1 MiB
  TensorSpec spec{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  spec.initial.assign(n * 4, 0);
  auto ta = a.Declare(spec).value();
  auto tb = b.Declare(spec).value();
  ASSERT_TRUE(a.Initialize().ok());
  ASSERT_TRUE(b.WaitForInit(5s).ok());
  const TensorInfo info = a.info(ta).value();
  ASSERT_EQ(info.chunks.size(), 4u);
  std::vector<float> ones(n, 1.0f), twos(n, 2.0f);
  PushItem pa{ta, ones.data(), n * 4, DType::kF32, BufferMemory::kHost, ChunkPart{0, 2}};
  PushItem pb{tb, twos.data(), n * 4, DType::kF32, BufferMemory::kHost, ChunkPart{1, 2}};
  const uint64_t put_before = a.counters().put_bytes;  // the initial value's
  ASSERT_TRUE(a.Push({pa}).ok());
  ASSERT_TRUE(b.Push({pb}).ok());
  EXPECT_EQ(a.counters().put_bytes - put_before, n * 2) << "worker 0 put more than chunks 0 and 2";

  std::vector<float> part(n, -1.0f), all(n);
  PullItem odd{ta, part.data(), n * 4, 2, DType::kF32, 0, BufferMemory::kHost, ChunkPart{1, 2}};
  ASSERT_TRUE(a.Pull({odd}).ok());
  ASSERT_TRUE(b.Pull({PullItem::Of<float>(tb, all, 2)}).ok());
  for (size_t c = 0; c < 4; ++c) {
    const size_t first = info.chunks[c].elem_offset, last = first + info.chunks[c].elem_count - 1;
    EXPECT_EQ(all[first], c % 2 ? 2.0f : 1.0f) << "chunk " << c;
    EXPECT_EQ(all[last], c % 2 ? 2.0f : 1.0f) << "chunk " << c;
    EXPECT_EQ(part[first], c % 2 ? 2.0f : -1.0f) << "chunk " << c;
    EXPECT_EQ(part[last], c % 2 ? 2.0f : -1.0f) << "chunk " << c;
  }
  PushItem bad{ta, ones.data(), n * 4, DType::kF32, BufferMemory::kHost, ChunkPart{2, 2}};
  Status st = a.Push({bad});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("chunk part 2 of 2"), std::string::npos) << st.ToString();

  // push_pull takes a part the same way: chunks 0 and 2 only, both ways.
  std::vector<float> back(n, -1.0f);
  const uint64_t put_mid = a.counters().put_bytes;
  PushPullItem pp{ta,          ones.data(),         back.data(),    n * 4,
                  DType::kF32, BufferMemory::kHost, ChunkPart{0, 2}};
  ASSERT_TRUE(a.PushPull({pp}).ok());
  EXPECT_EQ(a.counters().put_bytes - put_mid, n * 2) << "push_pull put more than its part";
  for (size_t c = 0; c < 4; ++c) {
    const size_t first = info.chunks[c].elem_offset, last = first + info.chunks[c].elem_count - 1;
    EXPECT_EQ(back[first], c % 2 ? -1.0f : 2.0f) << "chunk " << c;
    EXPECT_EQ(back[last], c % 2 ? -1.0f : 2.0f) << "chunk " << c;
  }
  pp.chunks = ChunkPart{1, 0};
  st = a.PushPull({pp});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST_P(ClusterTest, AdamOnBf16KeepsAnF32Master) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  TensorSpec spec{"b", DType::kBF16, {1000}, UpdateRule::kAdam, {}, -1};
  spec.hyper.learning_rate = 1e-3f;
  std::vector<uint16_t> ones(1000, FloatToBFloat16(1.0f));
  spec.initial.resize(2000);
  std::memcpy(spec.initial.data(), ones.data(), 2000);
  auto b = c.Declare(spec);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(c.Initialize().ok());
  // Each Adam step moves a weight by ~lr = 1e-3, below bf16's resolution at
  // 1.0 (2^-7): stored in bf16 alone the weights would never move. The f32
  // master accumulates the 5 steps: 0.995, which rounds to 0.99609375.
  std::vector<uint16_t> grad(1000, FloatToBFloat16(1.0f)), got(1000);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.Push({{*b, grad.data(), 2000, DType::kBF16}}).ok());
  ASSERT_TRUE(c.Pull({{*b, got.data(), 2000, 6, DType::kBF16}}).ok());
  EXPECT_EQ(BFloat16ToFloat(got[0]), 0.99609375f);
  auto bad = c.Declare({"counts", DType::kI32, {4}, UpdateRule::kAdam, {}, -1});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("floating"), std::string::npos) << bad.status().ToString();
}

// SyncReplicasOptimizer semantics: N synchronous steps of 3 workers give
// exactly the reference computed from the same gradients (averaged, SGD, f64),
// whatever order the pushes arrive in.
TEST_P(ClusterTest, SyncStepsMatchReferenceExactly) {
  StartCluster(2, 3);
  const size_t n = 200000;  // chunked over both shards
  TensorSpec spec{"w", DType::kF64, {static_cast<int64_t>(n)}, UpdateRule::kSgd, {}, -1};
  spec.hyper.learning_rate = 0.25f;
  spec.mode = ConsistencyMode::Sync(3, 3, /*average=*/true);
  std::vector<double> ref(n, 1.0);
  spec.initial.resize(n * 8);
  std::memcpy(spec.initial.data(), ref.data(), n * 8);
  std::vector<Client*> workers;
  std::vector<Tensor> handles;
  for (int w = 0; w < 3; ++w) {
    workers.push_back(&Connect(w));
    auto t = workers.back()->Declare(spec);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    handles.push_back(*t);
  }
  ASSERT_TRUE(workers[0]->Initialize().ok());
  // Integer-valued gradients: their sum is exact in any order.
  auto gradient = [](int w, int t, size_t i) {
    return static_cast<double>((i + 7 * w + 3 * t) % 11) - 5;
  };
  const int steps = 5;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      if (w > 0 && !workers[w]->WaitForInit(10s).ok()) failures++;
      std::vector<double> g(n), got(n);
      for (int t = 0; t < steps; ++t) {
        for (size_t i = 0; i < n; ++i) g[i] = gradient(w, t, i);
        if (!workers[w]->Push({PushItem::Of<double>(handles[w], g)}, t).ok()) failures++;
        // Step t+1's weights: everyone's step t applied.
        if (!workers[w]->Pull({PullItem::AfterStep<double>(handles[w], got, t + 1)}).ok())
          failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures, 0);
  const double lr = static_cast<double>(0.25f);
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int w = 0; w < 3; ++w) sum += gradient(w, t, i);
      ref[i] -= lr * (sum * (1.0 / 3));
    }
  }
  std::vector<double> got(n);
  ASSERT_TRUE(workers[0]->Pull({PullItem::AfterStep<double>(handles[0], got, steps)}).ok());
  EXPECT_TRUE(got == ref) << "element 0: " << got[0] << " vs " << ref[0];
  uint64_t applied = 0;
  for (auto& srv : servers_) applied += srv->stats().sync_steps_applied;
  EXPECT_EQ(applied, steps * 2u) << "one step per chunk per shard";
  EXPECT_EQ(EventualGlobalStep(*workers[2], steps), static_cast<uint64_t>(steps));
}

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
    Status st = c.Push({PushItem::Of<float>(t, one)}, s);
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
        if (!workers[w]->Push({PushItem::Of<double>(handles[w], g)}, t).ok()) failures++;
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
  ASSERT_TRUE(c[0]->Push({PushItem::Of<float>(t[0], one)}, 0).ok());
  ASSERT_TRUE(c[0]->Push({PushItem::Of<float>(t[0], one)}, 0).ok());  // duplicate
  EXPECT_EQ(c[0]->counters().chunks_dropped_duplicate, 1u);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(waiting.ready()) << "step 0 has 1 of 2 replicas";
  ASSERT_TRUE(c[1]->Push({PushItem::Of<float>(t[1], one)}, 0).ok());
  ASSERT_TRUE(waiting.Wait().ok());
  EXPECT_EQ(got, std::vector<float>(4, 2.0f));
  ASSERT_TRUE(c[2]->Push({PushItem::Of<float>(t[2], one)}, 0).ok());  // backup: too late
  EXPECT_EQ(c[2]->counters().chunks_dropped_stale, 1u);
  auto stats = servers_[0]->stats();
  EXPECT_EQ(stats.stale_pushes_dropped, 1u);
  EXPECT_EQ(stats.duplicate_pushes_dropped, 1u);
  EXPECT_EQ(stats.sync_steps_applied, 1u);
  // Step 1 goes on without the backup's stale contribution.
  ASSERT_TRUE(c[2]->Push({PushItem::Of<float>(t[2], one)}, 1).ok());
  ASSERT_TRUE(c[1]->Push({PushItem::Of<float>(t[1], one)}, 1).ok());
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
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, 0).ok());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, 0).ok());
  auto waiting = c0.PullAsync({PullItem::AfterStep<float>(t0, got, 1)});
  c2.reset();  // worker 2 goes away without pushing step 0
  Status st = waiting.WaitFor(10s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("/job:worker/task:2"), std::string::npos) << st.ToString();
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
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, 0).ok());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, 0).ok());
  auto waiting = c0.PullAsync({PullItem::AfterStep<float>(t0, got, 1)});
  Client& back = Connect(2);
  TensorSpec spec{"w", DType::kF32, {4}, UpdateRule::kAdd, {}, -1};
  spec.mode = ConsistencyMode::Sync(3, 3, /*average=*/false);  // as ThreeSyncWorkers
  Tensor t2 = back.Declare(spec).value();
  ASSERT_TRUE(back.WaitForInit().ok());
  EXPECT_FALSE(waiting.ready());
  ASSERT_TRUE(back.Push({PushItem::Of<float>(t2, one)}, 0).ok());
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
  ASSERT_TRUE(c0.Push({PushItem::Of<float>(t0, one)}, 0).ok());
  ASSERT_TRUE(c1.Push({PushItem::Of<float>(t1, one)}, 0).ok());
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
    ASSERT_TRUE(fast.Push({PushItem::Of<float>(tf, one)}, step).ok());
  // fast is at step 3 with s = 1: it needs every worker past step 1 (2 steps pushed).
  auto pull = fast.PullAsync({PullItem::AfterStep<float>(tf, got, 3 - 1)});
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(pull.ready());
  ASSERT_TRUE(slow.Push({PushItem::Of<float>(ts, one)}, 0).ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(pull.ready()) << "slow has pushed 1 step, 2 are needed";
  ASSERT_TRUE(slow.Push({PushItem::Of<float>(ts, one)}, 1).ok());
  ASSERT_TRUE(pull.Wait().ok());
  EXPECT_EQ(got, std::vector<float>(2, 5.0f));
}

// TensorFlow's dedicated "chief" task: it is rank 0, initialises, and the
// workers wait for it.
TEST_P(ClusterTest, DedicatedChiefTaskInitialises) {
  ASSERT_TRUE(spec_.AddJob("chief", {{"127.0.0.1", testing::UnusedPort()}}).ok());
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

TEST_P(ClusterTest, SeparateCoordinatorTask) {
  ASSERT_TRUE(spec_.AddJob("coordinator", {{"127.0.0.1", testing::UnusedPort()}}).ok());
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

INSTANTIATE_TEST_SUITE_P(Transports, ClusterTest,
                         ::testing::Values("native", "tcp", "posix,sysv,cma,tcp"),
                         ClusterTest::Name);

}  // namespace
}  // namespace tessera
