// The handshake and the admission policy, without sockets: what each side
// proves, when, and what a stranger can and cannot get out of a shard.
#include <gtest/gtest.h>

#include <algorithm>

#include "server/admission.h"
#include "tessera/cluster.h"
#include "wire/handshake.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using server::Admission;
using server::AdmissionOptions;
using wire::ClientHandshake;
using wire::ServerHandshake;

const std::string kSecret = "0123456789abcdef0123456789abcdef";

wire::Hello WorkerHello() {
  wire::Hello hello;
  hello.task_index = 1;
  hello.task = "/job:worker/task:1";
  hello.cluster = R"({"ps":["h:1"],"worker":["h:2","h:3"]})";
  return hello;
}

// The hello and the challenge go through the wire as a peer sends them.
template <typename Msg>
Msg Wire(const Msg& m) {
  return wire::Decode<Msg>(wire::Encode(m, 1)).value();
}

TEST(Handshake, PeersWithTheSecretWelcomeEachOther) {
  ClientHandshake client(kSecret, WorkerHello());
  ServerHandshake server(kSecret);
  auto challenge = Wire(server.OnHello(Wire(client.hello()), 0));
  auto auth = Wire(client.Answer(challenge));
  ASSERT_TRUE(server.CheckAuth(auth, "h:9").ok());
  wire::Welcome welcome;
  welcome.server_proof = server.ServerProof();
  EXPECT_TRUE(client.CheckWelcome(Wire(welcome), 0, "/job:ps/task:0").ok());
  EXPECT_EQ(server.hello().task, "/job:worker/task:1");
}

// Session protection: what each side asks, whether the transport can and
// whether the peer is on loopback decide it; the server's proof covers the
// decision, and both sides derive the same keys, each direction its own.
struct Protected {
  SessionProtection session;  // the welcome's decision
  Status client_view;
  SessionKeys client, server;
};
Protected Negotiate(SessionProtection client_asks, SessionProtection server_asks, bool can,
                    bool loopback, SessionProtection forged = SessionProtection::kAuto) {
  wire::Hello hello = WorkerHello();
  hello.protection = client_asks;
  ClientHandshake client(kSecret, hello);
  ServerHandshake server(kSecret);
  auto challenge = Wire(server.OnHello(Wire(client.hello()), 0));
  EXPECT_TRUE(server.CheckAuth(Wire(client.Answer(challenge)), "h:9").ok());
  wire::Welcome welcome;
  welcome.protection = server.DecideProtection(server_asks, can, loopback);
  welcome.server_proof = server.ServerProof();
  // Someone on the path rewrites the decision.
  if (forged != SessionProtection::kAuto) welcome.protection = forged;
  Protected out{
      welcome.protection, client.CheckWelcome(Wire(welcome), 0, "/job:ps/task:0"), {}, {}};
  if (out.client_view.ok()) out.client = client.Keys();
  out.server = server.Keys();
  return out;
}

TEST(Handshake, SessionProtectionIsDecidedByBothSidesAndTheRoute) {
  using P = SessionProtection;
  auto decided = [](P client, P server, bool loopback) {
    return Negotiate(client, server, /*can=*/true, loopback).session;
  };
  // auto: encrypted off the host, unprotected on loopback.
  EXPECT_EQ(decided(P::kAuto, P::kAuto, false), P::kOn);
  EXPECT_EQ(decided(P::kAuto, P::kAuto, true), P::kOff);
  // Either side's on encrypts, even where the other said off or integrity.
  EXPECT_EQ(decided(P::kOn, P::kAuto, true), P::kOn);
  EXPECT_EQ(decided(P::kAuto, P::kOn, true), P::kOn);
  EXPECT_EQ(decided(P::kOn, P::kOff, false), P::kOn);
  EXPECT_EQ(decided(P::kIntegrity, P::kOn, false), P::kOn);
  // Else either side's integrity authenticates, loopback or not.
  EXPECT_EQ(decided(P::kIntegrity, P::kAuto, true), P::kIntegrity);
  EXPECT_EQ(decided(P::kOff, P::kIntegrity, false), P::kIntegrity);
  // Off, where nobody asked for more, even off the host: the operator trusts the fabric.
  EXPECT_EQ(decided(P::kOff, P::kAuto, false), P::kOff);
  EXPECT_EQ(decided(P::kAuto, P::kOff, false), P::kOff);
  // A transport that cannot: off, and a client that asked refuses it by name.
  for (P asked : {P::kOn, P::kIntegrity}) {
    auto cannot = Negotiate(asked, P::kAuto, false, false);
    EXPECT_EQ(cannot.session, P::kOff);
    EXPECT_NE(cannot.client_view.message().find("the session, which this task asks for"),
              std::string::npos)
        << cannot.client_view.ToString();
  }
  EXPECT_TRUE(Negotiate(P::kAuto, P::kAuto, false, false).client_view.ok());
}

TEST(Handshake, BothSidesDeriveTheSameKeysEachDirectionItsOwn) {
  for (auto mode : {SessionProtection::kOn, SessionProtection::kIntegrity}) {
    auto p = Negotiate(mode, SessionProtection::kAuto, true, true);
    ASSERT_TRUE(p.client_view.ok()) << p.client_view.ToString();
    EXPECT_EQ(p.client.send.key, p.server.receive.key);
    EXPECT_EQ(p.client.send.iv, p.server.receive.iv);
    EXPECT_EQ(p.client.receive.key, p.server.send.key);
    EXPECT_EQ(p.client.receive.iv, p.server.send.iv);
    EXPECT_NE(p.client.send.key, p.client.receive.key);
    EXPECT_EQ(p.client.encrypt, mode == SessionProtection::kOn);
    EXPECT_EQ(p.server.encrypt, mode == SessionProtection::kOn);
    // A fresh handshake: fresh keys.
    auto q = Negotiate(mode, SessionProtection::kAuto, true, true);
    EXPECT_NE(p.client.send.key, q.client.send.key);
  }
}

// Someone on the path who changes the decision in the welcome (to off, or
// from encryption to integrity) fails the server's proof.
TEST(Handshake, TheProtectionDecisionCannotBeChangedInTransit) {
  using P = SessionProtection;
  EXPECT_EQ(Negotiate(P::kAuto, P::kAuto, true, false, P::kOff).client_view.code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(Negotiate(P::kAuto, P::kAuto, true, false, P::kIntegrity).client_view.code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(Negotiate(P::kAuto, P::kAuto, true, true, P::kOn).client_view.code(),
            StatusCode::kPermissionDenied);
}

// What the server says before the client proved anything is a nonce and its
// index: nothing computed from the secret that a guess could be tested on.
TEST(Handshake, ChallengeCarriesNothingDerivedFromTheSecret) {
  ServerHandshake a(kSecret), b("another secret, quite different!");
  wire::Hello hello = Wire(ClientHandshake(kSecret, WorkerHello()).hello());
  auto from_a = wire::Encode(a.OnHello(hello, 3), 1);
  auto from_b = wire::Encode(b.OnHello(hello, 3), 1);
  EXPECT_EQ(from_a.size(), wire::kHeaderSize + sizeof(Nonce) + 4);
  EXPECT_EQ(from_a.size(), from_b.size());
  EXPECT_NE(from_a, from_b) << "the server nonce must be fresh";
}

wire::Hello ReaderHello() {
  wire::Hello hello;
  hello.role = wire::PeerRole::kReader;
  hello.task = "/job:evaluator/task:0";
  hello.cluster = R"({"ps":["h:1"],"worker":["h:2","h:3"]})";
  return hello;
}

// The reader key is derived one way from the secret: the same for every
// task, never the secret itself, and useless for a worker's hello.
TEST(Handshake, ReaderKeyIsDerivedOneWay) {
  const std::string key = ReaderKey(kSecret);
  EXPECT_TRUE(key.starts_with(kReaderKeyPrefix)) << key;
  EXPECT_EQ(key.size(), kReaderKeyPrefix.size() + 64);
  EXPECT_EQ(key, ReaderKey(kSecret));
  EXPECT_NE(key, ReaderKey("another secret, quite different!"));
  EXPECT_EQ(key.find(kSecret), std::string::npos);
  EXPECT_EQ(ReaderKey(key), key) << "a reader key is its own reader key";
  EXPECT_TRUE(IsReaderKey(key));
  EXPECT_FALSE(IsReaderKey(kSecret));
}

TEST(Handshake, ReaderProvesItselfWithTheReaderKeyOnly) {
  // Given the reader key or the secret, a reader's hello is proved with the key.
  for (const std::string& given : {ReaderKey(kSecret), kSecret}) {
    ClientHandshake reader(given, ReaderHello());
    ServerHandshake server(kSecret);
    auto challenge = Wire(server.OnHello(Wire(reader.hello()), 0));
    ASSERT_TRUE(server.CheckAuth(Wire(reader.Answer(challenge)), "h:9").ok());
    wire::Welcome welcome;
    welcome.server_proof = server.ServerProof();
    EXPECT_TRUE(reader.CheckWelcome(Wire(welcome), 0, "/job:ps/task:0").ok());
  }
  // The reader key does not pass for a worker: a worker's hello proved
  // with it fails, and so does one changed to a worker's on the way.
  ClientHandshake impostor(ReaderKey(kSecret), WorkerHello());
  ServerHandshake server(kSecret);
  auto challenge = server.OnHello(Wire(impostor.hello()), 0);
  Status st = server.CheckAuth(impostor.Answer(challenge), "h:9");
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  ClientHandshake reader(ReaderKey(kSecret), ReaderHello());
  wire::Hello promoted = reader.hello();
  promoted.role = wire::PeerRole::kWorker;
  ServerHandshake other(kSecret);
  auto challenge2 = other.OnHello(promoted, 0);
  EXPECT_FALSE(other.CheckAuth(reader.Answer(challenge2), "h:9").ok());
  // A reader with a wrong key is refused, saying which key it lacks.
  ClientHandshake stranger(ReaderKey("not the cluster's secret at all!"), ReaderHello());
  ServerHandshake third(kSecret);
  Status refused = third.CheckAuth(stranger.Answer(third.OnHello(stranger.hello(), 0)), "h:9");
  EXPECT_NE(refused.message().find("reader key"), std::string::npos) << refused.ToString();
}

TEST(Handshake, WrongSecretIsRefusedByTheServer) {
  ClientHandshake client("a guess at the secret, 32 bytes!", WorkerHello());
  ServerHandshake server(kSecret);
  auto challenge = server.OnHello(client.hello(), 0);
  Status st = server.CheckAuth(client.Answer(challenge), "10.1.2.3:555");
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("/job:worker/task:1 at 10.1.2.3:555"), std::string::npos)
      << st.ToString();
}

TEST(Handshake, ServerWithoutTheSecretIsRefusedByTheClient) {
  ClientHandshake client(kSecret, WorkerHello());
  ServerHandshake impostor("not the cluster's secret at all!");
  auto challenge = impostor.OnHello(client.hello(), 0);
  (void)client.Answer(challenge);
  wire::Welcome welcome;
  welcome.server_proof = impostor.ServerProof();
  Status st = client.CheckWelcome(welcome, 0, "/job:ps/task:0 (h:1)");
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("/job:ps/task:0 (h:1) could not prove"), std::string::npos)
      << st.ToString();
}

// Both proofs bind every hello field: a hello changed on the way (a rank
// swapped for another) fails, and so does a proof made for another challenge.
TEST(Handshake, ProofsBindTheHelloAndTheChallenge) {
  ClientHandshake client(kSecret, WorkerHello());
  ServerHandshake server(kSecret);
  wire::Hello altered = client.hello();
  altered.task_index = 0;
  auto challenge = server.OnHello(altered, 0);
  EXPECT_FALSE(server.CheckAuth(client.Answer(challenge), "h:9").ok());

  ServerHandshake first(kSecret), second(kSecret);
  ClientHandshake replayer(kSecret, WorkerHello());
  auto auth = replayer.Answer(first.OnHello(replayer.hello(), 0));
  (void)second.OnHello(replayer.hello(), 0);
  EXPECT_FALSE(second.CheckAuth(auth, "h:9").ok()) << "a recorded proof was accepted again";

  ServerHandshake silent(kSecret);  // an auth before any hello proves nothing
  EXPECT_FALSE(silent.CheckAuth(wire::Auth{}, "h:9").ok());
}

TEST(Handshake, AnotherTaskAtTheAddressIsNamed) {
  ClientHandshake client(kSecret, WorkerHello());
  ServerHandshake server(kSecret);
  auto challenge = server.OnHello(client.hello(), 1);
  ASSERT_TRUE(server.CheckAuth(client.Answer(challenge), "h:9").ok());
  wire::Welcome welcome;
  welcome.server_proof = server.ServerProof();
  Status st = client.CheckWelcome(welcome, 0, "/job:ps/task:0 (h:1)");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("is ps task 1, but this task's cluster spec has it as ps task 0"),
            std::string::npos)
      << st.ToString();
}

// ClientHandshake::OnFrame, the one reader of the server's side: the frames
// in turn, an error frame as its status, anything else refused by name.
TEST(Handshake, ClientReadsTheServerFramesInTurn) {
  ClientHandshake client(kSecret, WorkerHello());
  ServerHandshake server(kSecret);
  wire::Welcome early;
  auto out_of_turn = client.OnFrame(wire::Encode(early, 1), 0u, "ps task 0");
  ASSERT_FALSE(out_of_turn.ok());
  EXPECT_NE(out_of_turn.status().message().find("welcome during the handshake, before a challenge"),
            std::string::npos)
      << out_of_turn.status().message();
  auto refused = client.OnFrame(
      wire::Encode(wire::Error{StatusCode::kPermissionDenied, "not in the cluster"}, 1), 0u, "x");
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);

  auto auth = client.OnFrame(wire::Encode(server.OnHello(Wire(client.hello()), 2), 1), 2u, "x");
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  ASSERT_TRUE(std::holds_alternative<wire::Auth>(*auth));
  ASSERT_TRUE(server.CheckAuth(Wire(std::get<wire::Auth>(*auth)), "h:9").ok());
  wire::Welcome welcome;
  welcome.server_proof = server.ServerProof();
  auto wrong_task = ClientHandshake(client).OnFrame(wire::Encode(welcome, 2), 1u, "h:1");
  EXPECT_EQ(wrong_task.status().code(), StatusCode::kFailedPrecondition);
  auto welcomed = client.OnFrame(wire::Encode(welcome, 2), std::nullopt, "h:1");
  ASSERT_TRUE(welcomed.ok()) << welcomed.status().ToString();
  EXPECT_TRUE(std::holds_alternative<wire::Welcome>(*welcomed));
}

TEST(ClusterSpecDifference, NamesWhatDiffers) {
  auto a = ClusterSpec::FromJson(R"({"ps":["a:1","b:1"],"worker":["w:1","w:2"]})").value();
  auto same_but_workers = ClusterSpec::FromJson(R"({"ps":["a:1","b:1"],"worker":["x:1","x:2"]})");
  EXPECT_EQ(a.DifferenceFrom(same_but_workers.value()), "");
  auto swapped = ClusterSpec::FromJson(R"({"ps":["b:1","a:1"],"worker":["w:1","w:2"]})").value();
  EXPECT_EQ(a.DifferenceFrom(swapped), "ps tasks are [a:1, b:1] here but [b:1, a:1] there");
  auto fewer = ClusterSpec::FromJson(R"({"ps":["a:1"],"worker":["w:1"]})").value();
  EXPECT_EQ(a.DifferenceFrom(fewer),
            "ps tasks are [a:1, b:1] here but [a:1] there; 2 workers here but 1 there");
  auto chief = ClusterSpec::FromJson(R"({"ps":["a:1","b:1"],"chief":["c:1"],"worker":["w:1"]})");
  EXPECT_EQ(a.DifferenceFrom(chief.value()), "a chief task there but not here");
}

TEST(Admission, AFullTablePushesOutTheOldestThatHasNotSaidHelloFirst) {
  AdmissionOptions o;
  o.max_unauthenticated = 2;
  Admission a(o);
  a.AddClusterHost("h");
  const auto t0 = Admission::Clock::time_point{};
  EXPECT_TRUE(a.Admit(1, "h", t0).admitted.ok());
  EXPECT_TRUE(a.Admit(2, "h", t0 + 1ms).admitted.ok());
  a.NoteHello(1);  // 1's handshake is under way: 2, silent, goes first
  auto d = a.Admit(3, "h", t0 + 2ms);
  EXPECT_TRUE(d.admitted.ok());
  ASSERT_TRUE(d.evicted.has_value());
  EXPECT_EQ(*d.evicted, 2u);
  a.NoteHello(3);
  d = a.Admit(4, "h", t0 + 3ms);  // both under way: the older handshake goes
  ASSERT_TRUE(d.evicted.has_value());
  EXPECT_EQ(*d.evicted, 1u);
  a.NoteProven(3, "h");  // authenticated: no longer counted
  EXPECT_FALSE(a.Admit(5, "h", t0 + 4ms).evicted.has_value());
  EXPECT_EQ(a.unauthenticated(), 2u);
}

TEST(Admission, StrangersMakeRoomAmongStrangersOnly) {
  AdmissionOptions o;
  o.max_unauthenticated = 4;
  o.max_strangers = 2;
  Admission a(o);
  a.AddClusterHost("10.0.0.1");
  const auto t0 = Admission::Clock::time_point{};
  ASSERT_TRUE(a.Admit(1, "10.0.0.1", t0).admitted.ok());
  ASSERT_TRUE(a.Admit(2, "10.0.0.1", t0).admitted.ok());
  ASSERT_TRUE(a.Admit(3, "192.0.2.1", t0).admitted.ok());
  ASSERT_TRUE(a.Admit(4, "192.0.2.2", t0).admitted.ok());
  for (uint64_t c = 5; c < 100; ++c) {  // a flood from rotating addresses
    auto d = a.Admit(c, "192.0.2." + std::to_string(c), t0 + std::chrono::milliseconds(c));
    ASSERT_TRUE(d.admitted.ok());
    ASSERT_TRUE(d.evicted.has_value());
    EXPECT_GE(*d.evicted, 3u) << "a stranger pushed out a cluster host's connection";
  }
  EXPECT_EQ(a.strangers(), 2u);
  // The cluster's own push strangers out, not each other, while there are any.
  auto d = a.Admit(100, "10.0.0.1", t0 + 1s);
  ASSERT_TRUE(d.evicted.has_value());
  EXPECT_EQ(*d.evicted, 98u);
  EXPECT_EQ(a.strangers(), 1u);
}

TEST(Admission, StrangersAreRefusedWhenTheTableIsTheClustersAlone) {
  AdmissionOptions o;
  o.max_unauthenticated = 2;
  o.max_strangers = 1;
  Admission a(o);
  a.AddClusterHost("10.0.0.1");
  const auto t0 = Admission::Clock::time_point{};
  ASSERT_TRUE(a.Admit(1, "10.0.0.1", t0).admitted.ok());
  ASSERT_TRUE(a.Admit(2, "10.0.0.1", t0).admitted.ok());
  auto d = a.Admit(3, "192.0.2.1", t0);
  EXPECT_EQ(d.admitted.code(), StatusCode::kResourceExhausted) << d.admitted.ToString();
  EXPECT_FALSE(d.evicted.has_value());
}

TEST(Admission, StrangersPastTheDeadlineAreOverdue) {
  AdmissionOptions o;
  o.hello_deadline = 100ms;
  Admission a(o);
  const auto t0 = Admission::Clock::time_point{};
  (void)a.Admit(1, "h", t0);
  (void)a.Admit(2, "h", t0 + 60ms);
  a.NoteHello(2);
  EXPECT_TRUE(a.Overdue(t0 + 99ms).empty());
  EXPECT_EQ(a.Overdue(t0 + 100ms), std::vector<Admission::ConnId>{1});
  auto both = a.Overdue(t0 + 200ms);
  std::sort(both.begin(), both.end());
  EXPECT_EQ(both, (std::vector<Admission::ConnId>{1, 2}));
}

// Guesses from every stranger address together spend one budget, so
// rotating the source address gains nothing; a cluster host is never
// refused for what its neighbours guessed.
TEST(Admission, StrangersGuessesAreBoundedTogetherAndClusterHostsAreNeverRefused) {
  AdmissionOptions o;
  o.stranger_burst = 3;
  o.stranger_refill = 1000ms;
  Admission a(o);
  a.AddClusterHost("10.0.0.1");
  const auto t0 = Admission::Clock::time_point{} + 1h;
  for (int i = 0; i < 3; ++i) {  // admitted together, then each guesses wrong
    ASSERT_TRUE(a.Admit(i, "192.0.2." + std::to_string(i), t0).admitted.ok());
  }
  EXPECT_FALSE(a.Admit(3, "192.0.2.3", t0).admitted.ok()) << "each waiting stranger holds a guess";
  for (int i = 0; i < 3; ++i) a.NoteFailure(i);
  auto refused = a.Admit(9, "198.51.100.7", t0 + 10ms).admitted;
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("outside the cluster spec"), std::string::npos)
      << refused.ToString();
  EXPECT_NE(refused.message().find("990 ms"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(a.Admit(11, "198.51.100.7", t0 + 1000ms).admitted.ok()) << "one guess refilled";
  a.Forget(11);  // left without guessing: its guess is given back
  EXPECT_TRUE(a.Admit(12, "198.51.100.8", t0 + 1000ms).admitted.ok());
  EXPECT_EQ(a.stranger_failures(), 3u);
  for (uint64_t c = 100; c < 200; ++c) {
    ASSERT_TRUE(a.Admit(c, "10.0.0.1", t0 + 1001ms).admitted.ok()) << c;
    a.NoteFailure(c);
  }
  EXPECT_TRUE(a.Admit(13, "10.0.0.1", t0 + 1001ms).admitted.ok());
  EXPECT_EQ(a.cluster_host_failures(), 100u);
}

TEST(Admission, AHostThatProvedItselfIsNoStranger) {
  AdmissionOptions o;
  o.max_proven_hosts = 2;
  Admission a(o);
  const auto t0 = Admission::Clock::time_point{};
  EXPECT_TRUE(a.IsStranger("192.0.2.1"));
  ASSERT_TRUE(a.Admit(1, "192.0.2.1", t0).admitted.ok());
  a.NoteProven(1, "192.0.2.1");
  EXPECT_FALSE(a.IsStranger("192.0.2.1"));
  a.NoteProven(2, "192.0.2.2");
  a.NoteProven(3, "192.0.2.3");  // the longest unseen is forgotten
  EXPECT_TRUE(a.IsStranger("192.0.2.1"));
  EXPECT_FALSE(a.IsStranger("192.0.2.3"));
}

TEST(Admission, HostOfPeer) {
  EXPECT_EQ(server::HostOfPeer("10.0.0.1:7000"), "10.0.0.1");
  EXPECT_EQ(server::HostOfPeer("[::1]:7000"), "::1");
  EXPECT_EQ(server::HostOfPeer("fe80::1"), "fe80::1");
  EXPECT_EQ(server::HostOfPeer("[fe80::1]:7000"), "fe80::1");
  EXPECT_EQ(server::HostOfPeer("somehost"), "somehost");
}

}  // namespace
}  // namespace tessera
