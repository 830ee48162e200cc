// Who is what, once every rank has joined: AssignRoles.
#include <map>
#include <set>

#include "rendezvous/rendezvous.h"

namespace tessera::rendezvous {

Result<std::vector<Assignment>> AssignRoles(const std::vector<Join>& joins,
                                            const RolePolicy& policy) {
  const int n = static_cast<int>(joins.size());
  for (int i = 0; i < n; ++i) {
    if (joins[i].rank != i) return Status::Internal("the joins are not in rank order");
  }
  if (policy.num_ps > 0 && policy.ps_per_node > 0) {
    return Status::InvalidArgument("give --ps or --ps-per-node, not both");
  }
  std::vector<std::string> role(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Join& j = joins[i];
    if (!j.role.empty()) {
      role[i] = j.role;
    } else if (policy.ps_per_node > 0) {
      role[i] = j.local_rank < policy.ps_per_node ? "ps" : "worker";
    } else if (policy.num_ps > 0) {
      role[i] = i < policy.num_ps ? "ps" : "worker";
    } else {
      return Status::InvalidArgument("rank " + std::to_string(i) +
                                     " has no role: give --ps N or --ps-per-node K, or every "
                                     "task TESSERA_ROLE");
    }
  }
  // Indices by rank within each job, and per node.
  std::map<std::string, int> next_index;
  std::map<std::pair<std::string, std::string>, int> next_on_node;  // (job, node)
  std::vector<Assignment> out(static_cast<size_t>(n));
  std::vector<TaskAddress> ps, workers;
  std::set<std::pair<std::string, uint16_t>> addresses;
  for (int i = 0; i < n; ++i) {
    const Join& j = joins[i];
    Assignment& a = out[i];
    a.task = {role[i], next_index[role[i]]++};
    a.index_on_node = next_on_node[{role[i], j.node}]++;
    if (role[i] == "evaluator") continue;  // nobody's peer: not in the spec
    if (!addresses.insert({j.host, j.port}).second) {
      return Status::InvalidArgument("rank " + std::to_string(i) + " would listen on " + j.host +
                                     ":" + std::to_string(j.port) + ", as an earlier rank does");
    }
    (role[i] == "ps" ? ps : workers).push_back({j.host, j.port});
  }
  if (ps.empty()) return Status::InvalidArgument("no rank serves as a ps task");
  if (workers.empty()) {
    return Status::InvalidArgument("every rank of " + std::to_string(n) +
                                   " serves as a ps task: none is left to train");
  }
  ClusterSpec spec;
  TESSERA_RETURN_IF_ERROR(spec.AddJob("ps", ps));
  TESSERA_RETURN_IF_ERROR(spec.AddJob("worker", workers));
  for (auto& a : out) a.cluster = spec;
  return out;
}

}  // namespace tessera::rendezvous
