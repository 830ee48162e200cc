// The hardening review's attacks by strangers (findings 1-5), against real
// `tessera server` processes: each must leave the server alive, serving a
// legitimate worker, within a stated memory bound. docs/security.md says
// what each fabric can enforce; a case that a fabric cannot pass says why it
// skips.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "core/timeouts.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using testing::ClusterTest;
using testing::RawPeer;
using testing::ShardProcesses;

// What the server may grow by under any one attack.
constexpr long kRssBoundKiB = 32 * 1024;

// Whether this build's heap is a sanitizer's (ASan, TSan), which keeps
// freed memory for a while: then no process gives memory back on time.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedHeap = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizedHeap = true;
#else
constexpr bool kSanitizedHeap = false;
#endif
#else
constexpr bool kSanitizedHeap = false;
#endif

class SecurityTest : public ClusterTest {
 protected:
  bool native() const { return transport_ == "tcp"; }

  // One `tessera server` process and two worker tasks in the spec.
  void StartServer(std::map<int, std::vector<std::string>> env = {}) {
    const auto ports = testing::UnusedPorts(3);
    ASSERT_TRUE(spec_.AddJob("ps", {{host_, ports[0]}}).ok());
    ASSERT_TRUE(spec_.AddJob("worker", {{host_, ports[1]}, {host_, ports[2]}}).ok());
    server_ = std::make_unique<ShardProcesses>(
        spec_, secret_, 1, std::vector<std::string>{"--staging-mib", "4"}, std::move(env));
    ASSERT_TRUE(server_->started()) << "TESSERA_BIN is not set";
    port_ = spec_.tasks("ps")[0].port;
    // Waits until the server is up: a process under ASan in the Soft-RoCE
    // VM's emulation took 10 s to start, so the wait follows the harness's
    // TESSERA_TIMEOUT_SCALE.
    ClientOptions first = Options(0);
    first.startup_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(10'000 * TimeoutScale().value()));
    auto c = Client::Connect(first);
    ASSERT_TRUE(c.ok()) << c.status();
    chief_ = std::move(*c);
    auto w = chief_->Declare(F32("w", 1024, UpdateRule::kAdd));
    ASSERT_TRUE(w.ok()) << w.status();
    w_ = *w;
    ASSERT_TRUE(chief_->Initialize().ok());
    rss_before_ = testing::RssKiB(server_->pid(0));
  }

  // After an attack: the process lives, within the memory bound, and a new
  // worker connects and reads the value the chief wrote. `check_memory`
  // false: the attack's many allocations sit in a sanitizer's quarantine,
  // so the bound is the optimised build's to check.
  void ServerStillServes(bool check_memory = true) {
    ASSERT_EQ(kill(server_->pid(0), 0), 0) << "the server died";
    EXPECT_FALSE(server_->WaitExit(0, 0ms).has_value()) << "the server exited";
    if (check_memory) {
      const long grew = testing::RssKiB(server_->pid(0)) - rss_before_;
      std::printf("the server grew by %ld KiB (at most %ld)\n", grew, kRssBoundKiB);
      EXPECT_LT(grew, kRssBoundKiB) << "KiB the server grew by";
    }
    auto c = Client::Connect(Options(1));
    ASSERT_TRUE(c.ok()) << c.status();
    auto w = (*c)->Declare(F32("w", 1024, UpdateRule::kAdd));
    ASSERT_TRUE(w.ok()) << w.status();
    std::vector<float> got(1024, -1.0f);
    ASSERT_TRUE((*c)->Pull({PullItem::Of<float>(*w, got)}).ok());
    EXPECT_EQ(got, std::vector<float>(1024, 0.0f)) << "the parameter was changed";
  }

  std::unique_ptr<ShardProcesses> server_;
  std::unique_ptr<Client> chief_;
  Tensor w_;
  uint16_t port_ = 0;
  long rss_before_ = 0;
};

// Finding 1: 17 zero bytes, 4096 bytes of 0xff, or 8 of 0xff (a length of
// 2^64-1) to the listening port aborted the server (UCX 1.13's sockcm).
TEST_P(SecurityTest, GarbageOnTheListeningPort) {
  if (!native()) {
    GTEST_SKIP() << "UCX 1.13's tcp connection manager aborts the process on these bytes "
                    "(tcp_sockcm_ep.c, 'offset <= length'); UCX 1.22 survives them. "
                    "Not a Tessera bug: docs/security.md";
  }
  StartServer();
  for (const auto& garbage : {std::vector<uint8_t>(17, 0), std::vector<uint8_t>(4096, 0xff),
                              std::vector<uint8_t>(8, 0xff)}) {
    testing::RawTcpSocket s(port_);
    ASSERT_TRUE(s.connected());
    s.Send(garbage);
    EXPECT_TRUE(s.ClosedByServer()) << garbage.size() << " bytes";
  }
  ServerStillServes();
}

// Finding 2: about 1,017 idle connections shut real workers out, and none
// was ever closed.
TEST_P(SecurityTest, IdleConnectionsAreClosedAndDoNotLockWorkersOut) {
  if (!native()) {
    GTEST_SKIP() << "UCX accepts a raw TCP connection inside its own connection manager, "
                    "which never hands it to Tessera: only Tessera's tcp transport can "
                    "bound them (docs/security.md)";
  }
  StartServer({{0, {"TESSERA_HELLO_TIMEOUT_MS=1000"}}});
  std::vector<std::unique_ptr<testing::RawTcpSocket>> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(std::make_unique<testing::RawTcpSocket>(port_));
    ASSERT_TRUE(idle.back()->connected()) << i;
  }
  ServerStillServes();  // while 300 strangers hold connections open
  for (auto& s : idle) EXPECT_TRUE(s->ClosedByServer()) << "an idle connection was kept";
}

// Finding 3: a rendezvous announcing 1 GiB took the RSS to 925 MB; 64 GiB
// killed the server with bad_alloc. Here: a stranger's message of that size.
TEST_P(SecurityTest, HugeAnnouncementBeforeAuthenticationAllocatesNothing) {
  StartServer();
  for (size_t mib : {size_t{1}, size_t{64}}) {
    RawPeer stranger(spec_.tasks("ps")[0], transport_);
    ASSERT_TRUE(stranger.connected());
    stranger.endpoint().Send(1, MessageBytes(mib << 20, 0));
    EXPECT_TRUE(stranger.Next().empty()) << "the server answered a " << mib << " MiB hello";
  }
  ServerStillServes();
}

// Finding 4: a stranger wrote a parameter arena with a forged key, and a
// worker's real arena key (read-only) wrote it too.
TEST_P(SecurityTest, ArenasCannotBeWrittenWithForgedOrReadOnlyKeys) {
  if (!native()) {
    GTEST_SKIP() << "UCX tcp checks neither keys nor access flags, and UCX shared memory "
                    "trusts the same user: only Tessera's tcp transport and the HCA "
                    "(verbs, UCX rc) enforce them (docs/security.md)";
  }
  StartServer();
  // A worker that authenticated learns the arena's real, read-only key.
  RawPeer worker(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(wire::Decode<wire::Welcome>(worker.Authenticate(secret_, WorkerHello(1))).ok());
  worker.endpoint().MarkAuthenticated();
  wire::TensorDecl decl{"w", DType::kF32, UpdateRule::kAdd, {1024}, -1, {}, {}};
  decl.mode.total_num_replicas = 2;
  worker.Send(wire::Declare{1u << 20, 1, {decl}}, 3);
  auto placed = wire::Decode<wire::DeclareReply>(worker.Next());
  ASSERT_TRUE(placed.ok()) << placed.status();
  worker.Send(wire::Create{{{decl, 0, 1, 0, 1024}}}, 4);
  auto created = wire::Decode<wire::CreateReply>(worker.Next());
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_FALSE(created->arenas.empty());
  auto arena = worker.endpoint().Attach(created->arenas[0].region);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<uint8_t> evil(4096, 0xee);
  testing::Waiter<Status> written;
  worker.endpoint().Put(evil.data(), evil.size(), **arena,
                        (*arena)->base() + created->keys[0].arena_offset, written.callback());
  auto st = written.Wait();
  ASSERT_TRUE(st.has_value()) << "the put neither completed nor failed";
  EXPECT_FALSE(st->ok()) << "a write through a read-only key completed";
  ServerStillServes();
}

// Finding 7: a create with no declare grew a shard by 790 MB. Creates are
// still taken without one (workers restore placement so after a coordinator
// restart), but only while what the shard holds fits the memory it had free
// at start: one chunk of 2^40 f32 is refused, naming it, allocating nothing.
TEST_P(SecurityTest, ACreateWithoutADeclareIsBoundedByTheShardsMemory) {
  StartServer();
  RawPeer worker(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(wire::Decode<wire::Welcome>(worker.Authenticate(secret_, WorkerHello(1))).ok());
  worker.endpoint().MarkAuthenticated();
  wire::TensorDecl decl{"undeclared", DType::kF32, UpdateRule::kAdam, {int64_t{1} << 40}, -1,
                        {},           {}};
  worker.Send(wire::Create{{{decl, 0, 1, 0, uint64_t{1} << 40}}}, 4);
  auto err = wire::Decode<wire::Error>(worker.Next());
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_EQ(err->code, StatusCode::kResourceExhausted) << err->message;
  EXPECT_NE(err->message.find("with its optimizer state; this ps task's host memory holds"),
            std::string::npos)
      << err->message;
  worker.Send(wire::Ping{}, 5);
  EXPECT_TRUE(wire::Decode<wire::Ack>(worker.Next()).ok()) << "the connection was dropped";
  ServerStillServes();
}

// get-state and set-state (a trainer's state_dict): an authenticated worker
// that is not the chief cannot write optimizer state, and no range, slot,
// key or length it names makes the shard read, write or allocate beyond
// what the chunk holds; each refusal names what was wrong, and the
// connection stays usable.
TEST_P(SecurityTest, OptimizerStateRequestsAreBoundedAndRefusedByName) {
  StartServer();
  RawPeer worker(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(wire::Decode<wire::Welcome>(worker.Authenticate(secret_, WorkerHello(1))).ok());
  worker.endpoint().MarkAuthenticated();
  wire::TensorDecl decl{"w", DType::kF32, UpdateRule::kAdd, {1024}, -1, {}, {}};
  decl.mode.total_num_replicas = 2;
  worker.Send(wire::Declare{1u << 20, 1, {decl}}, 3);
  ASSERT_TRUE(wire::Decode<wire::DeclareReply>(worker.Next()).ok());
  worker.Send(wire::Create{{{decl, 0, 1, 0, 1024}}}, 4);
  auto created = wire::Decode<wire::CreateReply>(worker.Next());
  ASSERT_TRUE(created.ok()) << created.status();
  const uint32_t key = created->keys[0].key_id;
  // A length field of 2^32 - 1 with 16 bytes behind it: refused unread.
  MessageBytes huge = wire::Encode(
      wire::SetState{key, wire::StateSlotId::kFirst, 0, 1, std::vector<uint8_t>(16, 0xee)}, 10);
  const size_t blob_length_at = wire::kHeaderSize + 4 + 1 + 8 + 8;
  for (size_t i = 0; i < 4; ++i) huge[blob_length_at + i] = 0xff;
  struct Refused {
    MessageBytes frame;
    StatusCode code;
    const char* says;
  };
  const std::vector<Refused> cases = {
      {wire::Encode(wire::GetState{key, wire::StateSlotId::kFirst, 0, 4}, 5),
       StatusCode::kInvalidArgument, "keeps no state slot 0"},
      {wire::Encode(wire::GetState{key, wire::StateSlotId::kMaster, ~0ull - 2, 4}, 6),
       StatusCode::kInvalidArgument, "keeps no"},
      {wire::Encode(wire::GetState{key + 1000, wire::StateSlotId::kFirst, 0, 4}, 7),
       StatusCode::kNotFound, "unknown key id"},
      {wire::Encode(wire::GetState{key, wire::StateSlotId::kFirst, 0, wire::kMaxStateBytes + 1}, 8),
       StatusCode::kInvalidArgument, "get-state of 4194305 bytes"},
      {wire::Encode(wire::SetState{key, wire::StateSlotId::kFirst, 0, 1, {1, 2, 3, 4}}, 9),
       StatusCode::kPermissionDenied, "not the chief"},
      {huge, StatusCode::kInvalidArgument, "set-state refused"},
  };
  for (const auto& c : cases) {
    worker.endpoint().Send(1, c.frame);
    auto err = wire::Decode<wire::Error>(worker.Next());
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_EQ(err->code, c.code) << err->message;
    EXPECT_NE(err->message.find(c.says), std::string::npos) << err->message;
  }
  worker.Send(wire::Ping{}, 20);
  EXPECT_TRUE(wire::Decode<wire::Ack>(worker.Next()).ok()) << "the connection did not survive";
  ServerStillServes();
}

// A sync tensor needing 1,000 replicas in a 2-worker cluster was accepted
// from a worker that skipped its client's check, and the job never stepped.
TEST_P(SecurityTest, ASyncTensorNeedingMoreReplicasThanWorkersIsRefused) {
  StartServer();
  RawPeer worker(spec_.tasks("ps")[0], transport_);
  ASSERT_TRUE(wire::Decode<wire::Welcome>(worker.Authenticate(secret_, WorkerHello(1))).ok());
  worker.endpoint().MarkAuthenticated();
  wire::TensorDecl decl{"never", DType::kF32, UpdateRule::kAdd, {16}, -1, {}, {}};
  decl.mode.kind = Consistency::kSync;
  decl.mode.total_num_replicas = 1000;
  decl.mode.replicas_to_aggregate = 1000;
  worker.Send(wire::Declare{1u << 20, 1, {decl}}, 3);
  auto err = wire::Decode<wire::Error>(worker.Next());
  ASSERT_TRUE(err.ok()) << "the declare was not refused: " << err.status();
  EXPECT_EQ(err->code, StatusCode::kInvalidArgument) << err->message;
  EXPECT_NE(err->message.find("total_num_replicas 1000 exceeds the cluster's 2 workers"),
            std::string::npos)
      << err->message;
  ServerStillServes();
}

// Keys are tied to their connection and role: a reader holding a worker's
// captured staging key wrote into the worker's slot, and the worker's +1.0
// gradient was applied as -1000. Only Tessera's tcp can tell one
// connection's write from another's (docs/security.md).
TEST_P(SecurityTest, AStagingKeyWritesFromItsOwnConnectionOnly) {
  if (!native() && transport_ != "verbs") {
    GTEST_SKIP() << "UCX cannot tie a registration to one endpoint: Tessera's tcp and verbs (a "
                    "memory window bound to the worker's queue pair) enforce it "
                    "(docs/security.md)";
  }
  StartServer();
  if (HasFatalFailure()) return;
  RawPeer worker(spec_.tasks("ps")[0], transport_);
  auto welcome = wire::Decode<wire::Welcome>(worker.Authenticate(secret_, WorkerHello(1)));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  worker.endpoint().MarkAuthenticated();
  ASSERT_FALSE(welcome->staging_region.empty());

  RawPeer reader(spec_.tasks("ps")[0], transport_);
  wire::Hello hello{wire::PeerRole::kReader, 0, "/job:evaluator/task:0", {}, "", spec_.ToJson()};
  ASSERT_TRUE(wire::Decode<wire::Welcome>(reader.Authenticate(ReaderKey(secret_), hello)).ok());
  reader.endpoint().MarkAuthenticated();
  auto stolen = reader.endpoint().Attach(welcome->staging_region);
  ASSERT_TRUE(stolen.ok()) << stolen.status();
  std::vector<uint8_t> evil(64, 0xee);
  testing::Waiter<Status> written;
  reader.endpoint().Put(evil.data(), evil.size(), **stolen, (*stolen)->base(), written.callback());
  auto st = written.Wait();
  ASSERT_TRUE(st.has_value()) << "the reader's put neither completed nor failed";
  EXPECT_FALSE(st->ok()) << "a reader wrote into a worker's staging slot";

  // The worker's own write to its slot lands.
  auto own = worker.endpoint().Attach(welcome->staging_region);
  ASSERT_TRUE(own.ok()) << own.status();
  testing::Waiter<Status> own_written;
  worker.endpoint().Put(evil.data(), evil.size(), **own, (*own)->base(), own_written.callback());
  auto own_st = own_written.Wait();
  ASSERT_TRUE(own_st.has_value());
  EXPECT_TRUE(own_st->ok()) << own_st->ToString();
  ServerStillServes();
}

// The IPv4 addresses process `pid` listens on (from /proc: its socket
// inodes, and the namespace's table of tcp sockets).
std::vector<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), link_ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retrans, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retrans >> uid >> timeout >> inode;
    if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
    const uint32_t ip = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    out.push_back(std::to_string(ip & 0xff) + "." + std::to_string((ip >> 8) & 0xff) + "." +
                  std::to_string((ip >> 16) & 0xff) + "." + std::to_string(ip >> 24));
  }
  return out;
}

// With a loopback cluster, UCX's tcp interface still listened on the host's
// other addresses, where UCX checks no memory keys.
TEST_P(SecurityTest, ALoopbackServerListensOnLoopbackOnly) {
  StartServer();
  const std::vector<std::string> listening = ListeningAddresses(server_->pid(0));
  EXPECT_FALSE(listening.empty()) << "found none of the server's listening sockets";
  for (const auto& address : listening) {
    EXPECT_EQ(address.rfind("127.", 0), 0u) << "the server listens on " << address;
  }
}

// Finding 2: one bad proof a second from the workers' own address kept
// both workers out (it was refused at accept, before it could prove itself).
TEST_P(SecurityTest, AWorkerIsNeverRefusedForItsNeighboursGuesses) {
  StartServer();
  std::atomic<bool> stop{false};
  std::atomic<int> guesses{0};
  auto guess = [&] {
    RawPeer guesser(spec_.tasks("ps")[0], transport_);
    if (!guesser.connected()) return;
    auto reply = wire::Decode<wire::Error>(guesser.Authenticate(
        "a guess at the cluster secret #" + std::to_string(guesses.load()), WorkerHello(1)));
    if (reply.ok() && reply->code == StatusCode::kPermissionDenied) guesses++;
  };
  for (int i = 0; i < 20; ++i) guess();
  ASSERT_EQ(guesses.load(), 20) << "each guess was checked, and failed";
  // The neighbour goes on guessing while the worker starts: it gets in at
  // once, never refused, within a start-up deadline too short to wait out
  // any refusal.
  std::thread neighbour([&] {
    while (!stop) guess();
  });
  // Started once the neighbour is at it (a guess failed just before).
  const bool guessing = testing::WaitUntil([&] { return guesses.load() > 20; }, 30s);
  ClientOptions opts = Options(1);
  opts.startup_timeout = 2s;
  auto worker = Client::Connect(opts);
  stop = true;
  neighbour.join();
  ASSERT_TRUE(guessing) << "the neighbour's guesses were not checked";
  ASSERT_TRUE(worker.ok()) << worker.status();
  worker->reset();
  ServerStillServes();
}

// Finding 2: floods of strangers' connections (30,000 a second from one
// process failed 3 of 10 worker starts; three flooders ran the ps task out
// of descriptors and left 555 MB resident). Two flooding processes, from the
// workers' own address or from addresses rotated through 127/8, while
// workers join one after another; each join is timed (the promise's figure
// is measured by bench/flood.sh, not asserted here: the machine's speed is
// not the server's promise).
struct Flood {
  std::string mode;
  bool rotate;
};

class FloodTest : public SecurityTest {
 protected:
  struct FlooderReport {
    uint64_t connections = 0, guesses = 0;
    double seconds = 0;
  };
  static FlooderReport RunFlooder(uint16_t port, const Flood& flood, double seconds) {
    const char* bin = std::getenv("FLOODER");
    FlooderReport report;
    if (bin == nullptr) return report;
    const std::string cmd = std::string(bin) + " --port " + std::to_string(port) + " --mode " +
                            flood.mode + " --threads 4 --hold 75 --seconds " +
                            std::to_string(seconds) + (flood.rotate ? " --rotate" : "");
    FILE* out = popen(cmd.c_str(), "r");
    if (out == nullptr) return report;
    std::string text;
    char buf[512];
    while (fgets(buf, sizeof(buf), out) != nullptr) text += buf;
    pclose(out);
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return report;
    report.connections = j.value("connections", uint64_t{0});
    report.guesses = j.value("guesses", uint64_t{0});
    report.seconds = j.value("seconds", 0.0);
    return report;
  }
  void WorkersJoinThrough(const Flood& flood);
  static int OpenDescriptors(pid_t pid) {
    std::error_code ec;
    int n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      n++;
    }
    return n;
  }
};

void FloodTest::WorkersJoinThrough(const Flood& flood) {
  if (!native()) GTEST_SKIP() << "the flooder speaks Tessera's tcp; UCX's listener is UCX's own";
  if (std::getenv("FLOODER") == nullptr) GTEST_SKIP() << "FLOODER is not set";
  StartServer();
  const int fds_before = OpenDescriptors(server_->pid(0));
  constexpr double kSeconds = 4;
  const auto flood_began = std::chrono::steady_clock::now();
  auto a = std::async(std::launch::async, [&] { return RunFlooder(port_, flood, kSeconds); });
  auto b = std::async(std::launch::async, [&] { return RunFlooder(port_, flood, kSeconds); });
  int joins = 0;
  double slowest = 0;
  long most_rss = 0;
  // The server's descriptors, read as often as /proc allows while the flood
  // lasts: the bound holds at every moment, not only between joins.
  std::atomic<int> most_fds{0};
  std::atomic<bool> flood_over{false};
  std::thread sampler([&] {
    while (!flood_over) {
      const int n = OpenDescriptors(server_->pid(0));
      int seen = most_fds.load();
      while (n > seen && !most_fds.compare_exchange_weak(seen, n)) {
      }
      std::this_thread::sleep_for(1ms);  // a reading, not a wait for a condition
    }
  });
  struct StopSampler {
    std::atomic<bool>& over;
    std::thread& t;
    ~StopSampler() {
      over = true;
      t.join();
    }
  } stop_sampler{flood_over, sampler};
  while (a.wait_for(0s) != std::future_status::ready) {
    const auto t0 = std::chrono::steady_clock::now();
    auto c = Client::Connect(Options(1));
    ASSERT_TRUE(c.ok()) << "a worker did not join during the flood: " << c.status();
    auto w = (*c)->Declare(F32("w", 1024, UpdateRule::kAdd));
    ASSERT_TRUE(w.ok()) << w.status();
    slowest = std::max(
        slowest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    joins++;
    most_rss = std::max(most_rss, testing::RssKiB(server_->pid(0)));
  }
  const FlooderReport ra = a.get(), rb = b.get();
  flood_over = true;
  // Both flooders' guesses fall within this, their start-up included.
  const double flood_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_began).count();
  const uint64_t connections = ra.connections + rb.connections;
  std::printf(
      "flood %s%s: %llu connections in %.1f s (%.0f/s), %llu guesses checked; %d workers "
      "joined, the slowest in %.2f s; at most %d descriptors (%d before), RSS +%ld KiB\n",
      flood.mode.c_str(), flood.rotate ? " from rotating addresses" : "",
      static_cast<unsigned long long>(connections), ra.seconds,
      static_cast<double>(connections) / std::max(ra.seconds, 1e-9),
      static_cast<unsigned long long>(ra.guesses + rb.guesses), joins, slowest, most_fds.load(),
      fds_before, most_rss - rss_before_);
  // Not vacuous: the strangers overran the table of waiting connections.
  EXPECT_GT(connections, 4u * ServerOptions{}.max_unauthenticated) << "the flood was too thin";
  EXPECT_GE(joins, 1);
  // Strangers hold at most the table and the refused ones waiting to close.
  EXPECT_LE(most_fds.load(),
            fds_before + 2 * static_cast<int>(ServerOptions{}.max_unauthenticated) + 16);
  if (flood.rotate && flood.mode == "guess") {
    // Every stranger address together: 100 at once, then 100 a second.
    const double bound = 100 + 100 * flood_seconds + 1;
    EXPECT_LE(static_cast<double>(ra.guesses + rb.guesses), bound)
        << "strangers' guesses were not bounded together";
  }
  // Given back once it ended: what the server holds settles near where it began.
  EXPECT_TRUE(
      testing::WaitUntil([&] { return OpenDescriptors(server_->pid(0)) <= fds_before + 8; }, 20s))
      << OpenDescriptors(server_->pid(0)) << " descriptors after the flood, " << fds_before
      << " before";
  if (kSanitizedHeap) {
    // The server is built as this test is: its freed memory waits in the
    // sanitizer's quarantine, not in the heap malloc_trim gives back.
    std::printf("after the flood: RSS +%ld KiB (not checked: a sanitizer holds freed memory)\n",
                testing::RssKiB(server_->pid(0)) - rss_before_);
  } else {
    // What malloc_trim cannot give back (pages pinned by heap fragments)
    // varied from 0.9 to 6.7 MiB between runs of one flood; 100 bytes kept
    // per connection would be 8 to 23 MiB after these floods.
    constexpr long kKeptKiB = 8 * 1024;
    EXPECT_TRUE(testing::WaitUntil(
        [&] { return testing::RssKiB(server_->pid(0)) - rss_before_ <= kKeptKiB; }, 20s))
        << "the server kept " << testing::RssKiB(server_->pid(0)) - rss_before_
        << " KiB after the flood";
    std::printf("after the flood: RSS +%ld KiB\n", testing::RssKiB(server_->pid(0)) - rss_before_);
  }
  ServerStillServes(/*check_memory=*/!kSanitizedHeap);
}

TEST_P(FloodTest, SilentConnectionsFromTheWorkersAddress) { WorkersJoinThrough({"silent", false}); }
TEST_P(FloodTest, HellosFromTheWorkersAddress) { WorkersJoinThrough({"hello", false}); }
TEST_P(FloodTest, HellosFromRotatingAddresses) { WorkersJoinThrough({"hello", true}); }
TEST_P(FloodTest, GuessesFromTheWorkersAddress) { WorkersJoinThrough({"guess", false}); }
TEST_P(FloodTest, GuessesFromRotatingAddresses) { WorkersJoinThrough({"guess", true}); }

INSTANTIATE_TEST_SUITE_P(Transports, FloodTest, ::testing::Values("native"), ClusterTest::Name);

// verbs: inside the Soft-RoCE VM only (tests/rdma_vm_suite.sh runs the
// cases that apply to it); elsewhere they skip, saying so.
INSTANTIATE_TEST_SUITE_P(Transports, SecurityTest,
                         ::testing::Values("native", "tcp", "posix,sysv,cma,tcp", "verbs"),
                         ClusterTest::Name);

}  // namespace
}  // namespace tessera
