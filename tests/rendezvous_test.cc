// The rendezvous of tessera run, without an engine: what each engine's
// variables say, Slurm's host lists, who gets which role, and the exchange
// itself over loopback, against strangers and ranks that never come.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "core/secret.h"
#include "rendezvous/engine.h"
#include "rendezvous/frames.h"
#include "rendezvous/rendezvous.h"
#include "tests/test_util.h"

namespace tessera::rendezvous {
namespace {

using namespace std::chrono_literals;

EnvLookup Env(std::map<std::string, std::string> vars) {
  auto owned = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [owned](const char* name) -> const char* {
    auto it = owned->find(name);
    return it == owned->end() ? nullptr : it->second.c_str();
  };
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Engine, SlurmRankNodeListAndADerivedPort) {
  auto t = DetectEngine(Env({{"SLURM_PROCID", "3"},
                             {"SLURM_NTASKS", "4"},
                             {"SLURM_LOCALID", "1"},
                             {"SLURM_JOB_ID", "4242"},
                             {"SLURM_STEP_ID", "0"},
                             {"SLURM_STEP_NODELIST", "gpu[07-08],cpu1"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->engine, "slurm");
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 4);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->rendezvous_host, "gpu07");
  EXPECT_GE(t->rendezvous_port, 20000);
  EXPECT_LT(t->rendezvous_port, 30000);
  // Every rank of the step derives the same port; another step another one.
  auto again = DetectEngine(Env({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "4"},
                                 {"SLURM_JOB_ID", "4242"},
                                 {"SLURM_STEP_ID", "0"},
                                 {"SLURM_JOB_NODELIST", "gpu[07-08],cpu1"}}));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rendezvous_port, t->rendezvous_port);
  auto other = DetectEngine(Env({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "4"},
                                 {"SLURM_JOB_ID", "4242"},
                                 {"SLURM_STEP_ID", "1"},
                                 {"SLURM_JOB_NODELIST", "gpu07"}}));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->rendezvous_port, t->rendezvous_port);
}

TEST(Engine, OpenMpiOnOneNodeUsesLoopbackAndAcrossNodesAsksWhere) {
  auto one = DetectEngine(Env({{"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                               {"PMIX_NAMESPACE", "prterun-host-1234@1"},
                               // Inside a Slurm allocation: the MPI job is the one that counts.
                               {"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->engine, "openmpi");
  EXPECT_EQ(one->rank, 1);
  EXPECT_EQ(one->rendezvous_host, "127.0.0.1");
  auto spread = DetectEngine(Env({{"OMPI_COMM_WORLD_RANK", "1"},
                                  {"OMPI_COMM_WORLD_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                  {"PMIX_NAMESPACE", "x"}}));
  ASSERT_FALSE(spread.ok());
  EXPECT_TRUE(Contains(spread.status().message(), "--rendezvous")) << spread.status();
  auto told = DetectEngine(Env({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"TESSERA_RENDEZVOUS", "node1:4000"}}));
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(told->rendezvous_host, "node1");
  EXPECT_EQ(told->rendezvous_port, 4000);
}

TEST(Engine, TorchrunUsesThePortAfterItsStore) {
  auto t = DetectEngine(Env({{"RANK", "2"},
                             {"WORLD_SIZE", "3"},
                             {"LOCAL_RANK", "0"},
                             {"MASTER_ADDR", "10.0.0.5"},
                             {"MASTER_PORT", "29500"},
                             {"TESSERA_ROLE", "worker"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->engine, "torchrun");
  EXPECT_EQ(t->rendezvous_host, "10.0.0.5");
  EXPECT_EQ(t->rendezvous_port, 29501);
  EXPECT_EQ(t->role, "worker");
}

TEST(Engine, ErrorsNameTheVariable) {
  auto none = DetectEngine(Env({}));
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  struct Case {
    std::map<std::string, std::string> env;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{"SLURM_PROCID", "1"}}, "SLURM_NTASKS is not set"},
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "is not below"},
      {{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID='x'"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "1"}}, "NODELIST"},
      {{{"TESSERA_RANK", "0"}, {"TESSERA_WORLD_SIZE", "2"}}, "TESSERA_RENDEZVOUS"},
      {{{"TESSERA_RANK", "0"}, {"TESSERA_WORLD_SIZE", "2"}, {"TESSERA_RENDEZVOUS", "h"}},
       "rendezvous address"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, "MASTER_PORT"},
      {{{"TESSERA_RANK", "0"},
        {"TESSERA_WORLD_SIZE", "2"},
        {"TESSERA_RENDEZVOUS", "h:1"},
        {"TESSERA_ROLE", "boss"}},
       "TESSERA_ROLE='boss'"},
  };
  for (const auto& c : cases) {
    auto r = DetectEngine(Env(c.env));
    EXPECT_FALSE(r.ok()) << c.says;
    EXPECT_TRUE(Contains(r.status().message(), c.says))
        << r.status() << " (wanted " << c.says << ")";
  }
}

TEST(Engine, SlurmHostLists) {
  auto hosts = ExpandSlurmHostlist("node[01-03,7],gpu-a,rack[1-2]-n[9-10]");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  EXPECT_EQ(*hosts, (std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu-a",
                                              "rack1-n9", "rack1-n10", "rack2-n9", "rack2-n10"}));
  EXPECT_EQ(*ExpandSlurmHostlist("solo"), std::vector<std::string>{"solo"});
  for (const char* bad :
       {"node[1-", "node]", "node[3-1]", "node[a-b]", "x[1-2", "node[0-99999999]"}) {
    EXPECT_FALSE(ExpandSlurmHostlist(bad, 1000).ok()) << bad;
  }
  EXPECT_EQ(ExpandSlurmHostlist("n[1-1000],m[1-1000]", 1500).status().code(),
            StatusCode::kResourceExhausted);
}

std::vector<Join> Joins(const std::vector<std::pair<std::string, int>>& node_and_local) {
  std::vector<Join> joins;
  for (size_t i = 0; i < node_and_local.size(); ++i) {
    joins.push_back({static_cast<int>(i), static_cast<int>(node_and_local.size()),
                     node_and_local[i].second, node_and_local[i].first, "10.0.0.1",
                     static_cast<uint16_t>(7000 + i), ""});
  }
  return joins;
}

TEST(Roles, FirstRanksPerNodeOrByRole) {
  auto first = AssignRoles(Joins({{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}}), {2, 0});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)[1].task.ToString(), "/job:ps/task:1");
  EXPECT_EQ((*first)[2].task.ToString(), "/job:worker/task:0");
  EXPECT_EQ((*first)[3].cluster.tasks("ps")[1].port, 7001);
  EXPECT_EQ((*first)[3].index_on_node, 1) << "the second worker on node b";

  auto per_node = AssignRoles(Joins({{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}}), {0, 1});
  ASSERT_TRUE(per_node.ok()) << per_node.status();
  EXPECT_EQ((*per_node)[0].task.ToString(), "/job:ps/task:0");
  EXPECT_EQ((*per_node)[1].task.ToString(), "/job:worker/task:0");
  EXPECT_EQ((*per_node)[2].task.ToString(), "/job:ps/task:1");
  EXPECT_EQ((*per_node)[2].index_on_node, 0);

  auto joins = Joins({{"a", 0}, {"a", 1}, {"a", 2}});
  joins[0].role = "worker";
  joins[1].role = "ps";
  joins[2].role = "evaluator";
  auto given = AssignRoles(joins, {});
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ((*given)[0].task.ToString(), "/job:worker/task:0");
  EXPECT_EQ((*given)[1].task.ToString(), "/job:ps/task:0");
  EXPECT_EQ((*given)[2].task.ToString(), "/job:evaluator/task:0");
  EXPECT_EQ((*given)[2].cluster.num_tasks("evaluator"), 0) << "evaluators are nobody's peer";

  EXPECT_FALSE(AssignRoles(Joins({{"a", 0}, {"a", 1}}), {}).ok()) << "no policy, no roles";
  EXPECT_FALSE(AssignRoles(Joins({{"a", 0}, {"a", 1}}), {2, 0}).ok()) << "no worker left";
  auto same = Joins({{"a", 0}, {"a", 1}});
  same[1].port = same[0].port;
  auto clash = AssignRoles(same, {1, 0});
  EXPECT_TRUE(Contains(clash.status().message(), "as an earlier rank does")) << clash.status();
}

const std::string kSecret = "rendezvous-test-secret-0123456789";

// A rendezvous on loopback: rank 0's server, each rank's join on a thread.
struct Exchange {
  explicit Exchange(int world, RolePolicy policy = {1, 0}, std::chrono::milliseconds timeout = 20s)
      : port(testing::UnusedPort()),
        server(kSecret, ServeOptions{port, world, policy, timeout, 60s}) {
    EXPECT_TRUE(server.Listen().ok());
    serving = std::thread([this] { served = server.Serve(); });
  }
  ~Exchange() {
    if (serving.joinable()) serving.join();
  }
  Result<Assignment> JoinAs(int rank, int world, const std::string& secret = kSecret) {
    Join j{rank, world, 0, "node", "", static_cast<uint16_t>(9000 + rank), ""};
    return JoinRendezvous("127.0.0.1", port, secret, j, 20s);
  }
  uint16_t port;
  RendezvousServer server;
  std::thread serving;
  Status served;
};

TEST(Rendezvous, EveryRankLearnsTheSameClusterAndItsTask) {
  Exchange x(4, {2, 0});
  std::vector<Result<Assignment>> got(4, Status::Internal("not run"));
  std::vector<std::thread> ranks;
  for (int r = 3; r >= 0; --r) ranks.emplace_back([&, r] { got[r] = x.JoinAs(r, 4); });
  for (auto& t : ranks) t.join();
  x.serving.join();
  ASSERT_TRUE(x.served.ok()) << x.served;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ(got[r]->cluster.ToJson(), got[0]->cluster.ToJson());
    EXPECT_EQ(got[r]->task.job, r < 2 ? "ps" : "worker");
  }
  // The address each will listen on is where its connection came from.
  EXPECT_EQ(got[0]->cluster.tasks("ps")[0].ToString(), "127.0.0.1:9000");
  EXPECT_EQ(got[0]->cluster.tasks("worker")[1].ToString(), "127.0.0.1:9003");
}

TEST(Rendezvous, StrangersAreRefusedAndRanksThatNeverComeAreNamed) {
  Exchange x(3, {1, 0}, 2s);
  // A stranger without the secret, one with another world size, and one
  // announcing a huge join: each refused, and none of them counts.
  auto stranger = x.JoinAs(1, 3, "not the cluster's secret, at all!!");
  EXPECT_FALSE(stranger.ok());
  auto other_world = x.JoinAs(1, 5);
  EXPECT_FALSE(other_world.ok());
  {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(x.port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    uint8_t nonce[16];
    ASSERT_EQ(read(fd, nonce, 16), 16);
    uint8_t huge[20] = {};
    huge[16] = 0xff, huge[17] = 0xff, huge[18] = 0xff, huge[19] = 0x7f;
    ASSERT_EQ(write(fd, huge, sizeof huge), static_cast<ssize_t>(sizeof huge));
    uint8_t byte;
    EXPECT_LE(read(fd, &byte, 1), 0) << "the connection was kept";
    close(fd);
  }
  // Rank 0 joins; ranks 1 and 2 never do: rank 0 hears why, naming them.
  auto lonely = x.JoinAs(0, 3);
  ASSERT_FALSE(lonely.ok());
  EXPECT_EQ(lonely.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(lonely.status().message(), "rank(s) 1-2 of 3 did not join"))
      << lonely.status();
  x.serving.join();
  EXPECT_FALSE(x.served.ok());
}

TEST(Rendezvous, AnAnswerWithoutTheSecretIsRefused) {
  // A "rank 0" that does not know the secret (another job on the port).
  Result<std::vector<Assignment>> fake = AssignRoles(Joins({{"a", 0}, {"a", 1}}), {1, 0});
  ASSERT_TRUE(fake.ok());
  Nonce nc = RandomNonce(), ns = RandomNonce();
  auto frame = EncodeAnswer((*fake)[1], "another job's secret, not ours!!", nc, ns);
  auto decoded = DecodeAnswer(std::span<const uint8_t>(frame).subspan(4, frame.size() - 36),
                              std::span<const uint8_t>(frame).last(32), kSecret, nc, ns);
  EXPECT_EQ(decoded.status().code(), StatusCode::kPermissionDenied) << decoded.status();
  auto honest = EncodeAnswer((*fake)[1], kSecret, nc, ns);
  auto ok = DecodeAnswer(std::span<const uint8_t>(honest).subspan(4, honest.size() - 36),
                         std::span<const uint8_t>(honest).last(32), kSecret, nc, ns);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->task.ToString(), "/job:worker/task:0");
}

TEST(Rendezvous, JoinFramesAreCheckedBeforeTheyAreRead) {
  Nonce ns = RandomNonce(), nc = RandomNonce(), got{};
  Join j{1, 2, 0, "n", "", 7000, "worker"};
  auto frame = EncodeJoin(j, kSecret, ns, nc);
  for (size_t cut = 0; cut < frame.size(); ++cut) {
    auto partial = DecodeJoin(std::span<const uint8_t>(frame).first(cut), kSecret, ns, &got);
    ASSERT_TRUE(partial.ok()) << cut;
    EXPECT_FALSE(partial->has_value()) << "read before it was complete, at " << cut;
  }
  auto whole = DecodeJoin(frame, kSecret, ns, &got);
  ASSERT_TRUE(whole.ok() && whole->has_value()) << whole.status();
  EXPECT_EQ((*whole)->role, "worker");
  EXPECT_EQ(got, nc);
  auto tampered = frame;
  tampered[20] ^= 1;
  EXPECT_EQ(DecodeJoin(tampered, kSecret, ns, &got).status().code(), StatusCode::kPermissionDenied);
  EXPECT_FALSE(DecodeJoin(frame, kSecret, RandomNonce(), &got).ok()) << "replayed to another";
  Join bad_role = j;
  bad_role.role = "root";
  EXPECT_FALSE(DecodeJoin(EncodeJoin(bad_role, kSecret, ns, nc), kSecret, ns, &got).ok());
}

}  // namespace
}  // namespace tessera::rendezvous
