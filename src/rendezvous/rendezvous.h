// The rendezvous of a job an engine started: every task connects to rank 0,
// says who it is and where it will listen, and gets back the whole cluster
// spec and its own task in it. Rank 0 answers once every rank has joined.
//
//   rank 0  -> task    nonce Ns                                   (on accept)
//   task    -> rank 0  nonce Nc, join (JSON), HMAC(secret, "...-join" | Ns | Nc | join)
//   rank 0  -> task    answer (JSON), HMAC(secret, "...-answer" | Nc | Ns | answer)
//
// Both sides prove they hold the cluster secret, so a stranger can neither
// join nor hand out a cluster spec; rank 0 reads at most kMaxJoinBytes from
// a connection, and only until its deadline. A rank that never joins makes
// the rendezvous fail when its timeout passes, naming the ranks missing, and
// every rank that did join hears that error.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/socket_io.h"
#include "tessera/cluster.h"
#include "tessera/status.h"

namespace tessera::rendezvous {

// What a task says when it joins.
struct Join {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string node;  // its host's name: the ps of --ps-per-node are chosen per node
  // Where it will listen. Empty host: the address its connection to rank 0
  // came from, as rank 0 saw it.
  std::string host;
  uint16_t port = 0;
  std::string role;  // "ps", "worker", "evaluator", or "" for the policy to choose
};

// How the rendezvous assigns roles to tasks that have none of their own.
struct RolePolicy {
  int num_ps = 0;       // ranks 0..num_ps-1 serve as ps tasks
  int ps_per_node = 0;  // instead: the lowest local ranks of each node
};

// A task's place in the cluster.
struct Assignment {
  ClusterSpec cluster;
  TaskId task;  // {"ps", i}, {"worker", i} or {"evaluator", i}
  // Which of this node's ps tasks (or workers) it is: for picking GPUs and NICs.
  int index_on_node = 0;
};

// Pure: every rank's assignment, in rank order. Tasks with a role keep it;
// the rest take the policy's (ps first, then workers by rank: the lowest
// worker rank is the chief). Evaluators are not in the spec.
Result<std::vector<Assignment>> AssignRoles(const std::vector<Join>& joins,
                                            const RolePolicy& policy);

struct ServeOptions {
  uint16_t port = 0;
  int world_size = 1;
  RolePolicy policy;
  std::chrono::milliseconds timeout{300'000};  // for every rank to join
  // How often rank 0 says whom it still waits for (stderr).
  std::chrono::milliseconds report_interval{10'000};
};

// Rank 0's side, on its own thread: listens at once (Listen), then serves
// until every rank was answered or the timeout passed.
class RendezvousServer {
 public:
  RendezvousServer(std::string secret, ServeOptions options)
      : secret_(std::move(secret)), options_(std::move(options)) {}
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  Status Listen();
  // OK once every rank got its assignment; else why not (also sent to the
  // ranks that joined).
  Status Serve();

 private:
  std::string secret_;
  ServeOptions options_;
  Socket listener_;
};

// Every rank's side (rank 0's too): joins the rendezvous at host:port,
// retrying the connection until rank 0 listens, and waits for its
// assignment, all within `timeout`.
Result<Assignment> JoinRendezvous(const std::string& host, uint16_t port, const std::string& secret,
                                  const Join& join, std::chrono::milliseconds timeout);

// The bounds rank 0 holds a joining connection to.
constexpr size_t kMaxJoinBytes = 16 * 1024;
constexpr size_t kMaxAnswerBytes = 16u << 20;

}  // namespace tessera::rendezvous
