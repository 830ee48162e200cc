// What a cluster refuses and reports clearly: bad pushes, missing or silent
// shards and coordinators, wrong secrets, unauthenticated requests, leases.
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

}  // namespace
}  // namespace tessera
