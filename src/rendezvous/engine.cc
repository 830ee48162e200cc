#include "rendezvous/engine.h"

#include <cstdlib>
#include <string>

#include "tessera/cluster.h"

namespace tessera::rendezvous {
namespace {

// Ports derived from a job's id fall in [kDerivedPortBase, +kDerivedPortSpan):
// below Linux's default ephemeral range (32768-60999), so that no outgoing
// connection holds one.
constexpr uint32_t kDerivedPortBase = 20000;
constexpr uint32_t kDerivedPortSpan = 10000;

const char* Get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

Result<int> ParseCount(const char* name, const char* text, int min) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > (1 << 24)) {
    return Status::InvalidArgument(std::string(name) + "='" + text + "' is not a number of " +
                                   std::to_string(min) + " or more");
  }
  return static_cast<int>(v);
}

// FNV-1a: the same port from the same job id on every rank.
uint16_t DerivedPort(std::string_view job) {
  uint32_t h = 2166136261u;
  for (char c : job) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return static_cast<uint16_t>(kDerivedPortBase + h % kDerivedPortSpan);
}

// The rank variables of one engine.
struct RankVars {
  const char* engine;
  const char* rank;
  const char* size;
  const char* local_rank;
};

constexpr RankVars kEngines[] = {
    // Explicit ones win; then Open MPI (mpirun inside a Slurm allocation
    // sees both, and the MPI job is the one it started), Slurm, torchrun.
    {"tessera", "TESSERA_RANK", "TESSERA_WORLD_SIZE", "TESSERA_LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

// Where rank 0 listens, as the engine says or lets us derive.
Status FindRendezvous(const EnvLookup& env, const std::string& override_address, EngineTask* t) {
  std::string given = override_address;
  if (given.empty()) {
    if (const char* v = Get(env, "TESSERA_RENDEZVOUS")) given = v;
  }
  if (!given.empty()) {
    auto addr = TaskAddress::Parse(given);
    if (!addr.ok()) return addr.status().WithContext("the rendezvous address");
    t->rendezvous_host = addr->host;
    t->rendezvous_port = addr->port;
    return Status::Ok();
  }
  const char* port_text = Get(env, "TESSERA_RENDEZVOUS_PORT");
  auto port_or = [&](uint16_t derived) -> Result<uint16_t> {
    if (port_text == nullptr) return derived;
    auto p = ParseCount("TESSERA_RENDEZVOUS_PORT", port_text, 1);
    if (!p.ok() || *p > 65535) {
      return Status::InvalidArgument(std::string("TESSERA_RENDEZVOUS_PORT='") + port_text +
                                     "' is not a port");
    }
    return static_cast<uint16_t>(*p);
  };
  if (const char* master = Get(env, "MASTER_ADDR")) {
    const char* mport = Get(env, "MASTER_PORT");
    if (mport == nullptr && port_text == nullptr) {
      return Status::InvalidArgument("MASTER_ADDR is set but MASTER_PORT is not");
    }
    uint16_t derived = 0;
    if (mport != nullptr) {
      auto p = ParseCount("MASTER_PORT", mport, 1);
      if (!p.ok() || *p >= 65535) {
        return Status::InvalidArgument(std::string("MASTER_PORT='") + mport + "' is not a port");
      }
      derived = static_cast<uint16_t>(*p + 1);  // torchrun's store has MASTER_PORT itself
    }
    auto port = port_or(derived);
    if (!port.ok()) return port.status();
    t->rendezvous_host = master;
    t->rendezvous_port = *port;
    return Status::Ok();
  }
  if (t->engine == "slurm") {
    const char* nodes = Get(env, "SLURM_STEP_NODELIST");
    if (nodes == nullptr) nodes = Get(env, "SLURM_JOB_NODELIST");
    if (nodes == nullptr) {
      return Status::InvalidArgument("Slurm gives no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST");
    }
    auto hosts = ExpandSlurmHostlist(nodes);
    if (!hosts.ok()) return hosts.status().WithContext("SLURM_STEP_NODELIST");
    if (hosts->empty()) return Status::InvalidArgument("Slurm's node list is empty");
    const char* job = Get(env, "SLURM_JOB_ID");
    const char* step = Get(env, "SLURM_STEP_ID");
    if (job == nullptr && port_text == nullptr) {
      return Status::InvalidArgument("Slurm gives no SLURM_JOB_ID to derive the port from");
    }
    auto port = port_or(DerivedPort(std::string(job ? job : "") + "." + (step ? step : "")));
    if (!port.ok()) return port.status();
    t->rendezvous_host = hosts->front();
    t->rendezvous_port = *port;
    return Status::Ok();
  }
  if (t->engine == "openmpi") {
    const char* local_size = Get(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
    const char* job = Get(env, "PMIX_NAMESPACE");
    if (job == nullptr) job = Get(env, "OMPI_MCA_ess_base_jobid");
    if (local_size != nullptr && std::to_string(t->world_size) == local_size &&
        (job != nullptr || port_text != nullptr)) {
      // Every rank is on this node.
      auto port = port_or(DerivedPort(job ? job : ""));
      if (!port.ok()) return port.status();
      t->rendezvous_host = "127.0.0.1";
      t->rendezvous_port = *port;
      return Status::Ok();
    }
    return Status::InvalidArgument(
        "Open MPI does not say where rank 0 is when ranks span nodes: pass --rendezvous HOST:PORT, "
        "or set TESSERA_RENDEZVOUS (mpirun -x TESSERA_RENDEZVOUS=host:port)");
  }
  return Status::InvalidArgument(
      std::string(t->engine == "tessera" ? "TESSERA_RANK is set" : "this engine") +
      " but nothing says where rank 0 is: set TESSERA_RENDEZVOUS=host:port (or MASTER_ADDR "
      "and MASTER_PORT)");
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const char* name) { return std::getenv(name); };
}

Result<EngineTask> DetectEngine(const EnvLookup& env, const std::string& rendezvous) {
  for (const RankVars& vars : kEngines) {
    const char* rank = Get(env, vars.rank);
    const char* size = Get(env, vars.size);
    if (rank == nullptr && size == nullptr) continue;
    const std::string engine = vars.engine;
    if (rank == nullptr || size == nullptr) {
      return Status::InvalidArgument(engine + ": " + (rank ? vars.size : vars.rank) +
                                     " is not set, but " + (rank ? vars.rank : vars.size) + " is");
    }
    EngineTask t;
    t.engine = engine;
    auto r = ParseCount(vars.rank, rank, 0);
    if (!r.ok()) return r.status().WithContext(engine);
    auto n = ParseCount(vars.size, size, 1);
    if (!n.ok()) return n.status().WithContext(engine);
    if (*r >= *n) {
      return Status::InvalidArgument(engine + ": " + vars.rank + "=" + rank + " is not below " +
                                     vars.size + "=" + size);
    }
    t.rank = *r;
    t.world_size = *n;
    if (const char* local = Get(env, vars.local_rank)) {
      auto l = ParseCount(vars.local_rank, local, 0);
      if (!l.ok()) return l.status().WithContext(engine);
      t.local_rank = *l;
    }
    if (const char* role = Get(env, "TESSERA_ROLE")) {
      t.role = role;
      if (t.role != "ps" && t.role != "worker" && t.role != "evaluator") {
        return Status::InvalidArgument("TESSERA_ROLE='" + t.role +
                                       "': expected ps, worker or evaluator");
      }
    }
    TESSERA_RETURN_IF_ERROR(FindRendezvous(env, rendezvous, &t).WithContext(engine));
    return t;
  }
  return Status::NotFound(
      "no engine's variables: none of SLURM_PROCID, OMPI_COMM_WORLD_RANK, RANK (torchrun) or "
      "TESSERA_RANK is set (tessera run is started once per task by srun, mpirun, torchrun...)");
}

Result<std::vector<std::string>> ExpandSlurmHostlist(std::string_view list, size_t max_hosts) {
  std::vector<std::string> out;
  auto too_many = [&] {
    return Status::ResourceExhausted("the host list names more than " + std::to_string(max_hosts) +
                                     " hosts");
  };
  // One item (a prefix, bracketed ranges, a suffix, possibly repeated):
  // expanded into `out` as the cartesian product of its bracket groups.
  auto expand_item = [&](std::string_view item) -> Status {
    std::vector<std::string> names = {""};
    size_t i = 0;
    while (i < item.size()) {
      const size_t open = item.find('[', i);
      const std::string_view plain =
          item.substr(i, open == std::string_view::npos ? open : open - i);
      if (plain.find(']') != std::string_view::npos) {
        return Status::InvalidArgument("unbalanced ']' in '" + std::string(item) + "'");
      }
      for (auto& n : names) n += plain;
      if (open == std::string_view::npos) break;
      const size_t close = item.find(']', open);
      if (close == std::string_view::npos) {
        return Status::InvalidArgument("unbalanced '[' in '" + std::string(item) + "'");
      }
      std::vector<std::string> parts;
      std::string_view ranges = item.substr(open + 1, close - open - 1);
      while (true) {
        const size_t comma = ranges.find(',');
        const std::string_view r = ranges.substr(0, comma);
        const size_t dash = r.find('-');
        const std::string_view lo_text = r.substr(0, dash);
        const std::string_view hi_text =
            dash == std::string_view::npos ? lo_text : r.substr(dash + 1);
        auto number = [&](std::string_view s, uint64_t* v) {
          if (s.empty() || s.size() > 9) return false;
          *v = 0;
          for (char c : s) {
            if (c < '0' || c > '9') return false;
            *v = *v * 10 + static_cast<uint64_t>(c - '0');
          }
          return true;
        };
        uint64_t lo = 0, hi = 0;
        if (!number(lo_text, &lo) || !number(hi_text, &hi) || hi < lo) {
          return Status::InvalidArgument("bad range '" + std::string(r) + "' in '" +
                                         std::string(item) + "'");
        }
        if (hi - lo >= max_hosts) return too_many();
        for (uint64_t v = lo; v <= hi; ++v) {
          std::string digits = std::to_string(v);
          if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
          parts.push_back(std::move(digits));
        }
        if (comma == std::string_view::npos) break;
        ranges.remove_prefix(comma + 1);
      }
      if (names.size() * parts.size() > max_hosts) return too_many();
      std::vector<std::string> product;
      product.reserve(names.size() * parts.size());
      for (const auto& n : names) {
        for (const auto& p : parts) product.push_back(n + p);
      }
      names = std::move(product);
      i = close + 1;
    }
    if (out.size() + names.size() > max_hosts) return too_many();
    for (auto& n : names) {
      if (n.empty()) return Status::InvalidArgument("an empty host name in the host list");
      out.push_back(std::move(n));
    }
    return Status::Ok();
  };
  // Top-level commas separate items; those inside brackets separate ranges.
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0) return Status::InvalidArgument("unbalanced ']' in the host list");
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      if (i > start) TESSERA_RETURN_IF_ERROR(expand_item(list.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (depth != 0) return Status::InvalidArgument("unbalanced '[' in the host list");
  return out;
}

}  // namespace tessera::rendezvous
