// Where a task stands in a job that an engine started, read from the
// engine's own variables: its rank among the job's tasks, how many there
// are, its rank on its node, and where rank 0 listens for the rendezvous.
//
//   Slurm (srun)     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST
//                    (else SLURM_JOB_NODELIST): rank 0 is on its first node
//   Open MPI         OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   torchrun         RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   any              TESSERA_RANK, TESSERA_WORLD_SIZE, TESSERA_LOCAL_RANK
//
// The rendezvous address: TESSERA_RENDEZVOUS (host:port) or the caller's
// override, else MASTER_ADDR and MASTER_PORT + 1 (torchrun's own store
// listens on MASTER_PORT), else Slurm's first node, else, when every rank
// shares this node (Open MPI says so), loopback. The port, where the engine
// gives none, is derived from the job's id (TESSERA_RENDEZVOUS_PORT
// overrides it), so that every rank computes the same one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera::rendezvous {

struct EngineTask {
  std::string engine;  // "slurm", "openmpi", "torchrun", "tessera"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string rendezvous_host;  // where rank 0 listens
  uint16_t rendezvous_port = 0;
  // TESSERA_ROLE, when the engine gives each task its role ("ps",
  // "worker", "evaluator"); empty: the rendezvous assigns one.
  std::string role;
};

// Reads a variable; the default reads the process's environment. Tests
// pass their own.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup ProcessEnv();

// The task as its engine started it. `rendezvous` (host:port) overrides the
// address. An error names the engine and the variable that is missing or
// wrong; NotFound when no engine's variables are there at all.
Result<EngineTask> DetectEngine(const EnvLookup& env, const std::string& rendezvous = "");

// Slurm's compressed host lists: "node[01-03,7],gpu-a,x[1-2]-ib" ->
// node01 node02 node03 node7 gpu-a x1-ib x2-ib. At most `max_hosts`.
Result<std::vector<std::string>> ExpandSlurmHostlist(std::string_view list,
                                                     size_t max_hosts = 1u << 16);

}  // namespace tessera::rendezvous
