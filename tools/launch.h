// `tessera launch`: a local cluster of real processes on loopback. Each child
// gets its TF_CONFIG and the cluster secret; output is forwarded with a role
// prefix; everything is torn down when the workers finish, when any task
// fails, or on Ctrl-C.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::tools {

struct LaunchOptions {
  int num_ps = 1;
  int num_workers = 1;
  std::string host = "127.0.0.1";
  // The transport backend: given to the servers (--transport) and to the
  // workers (TESSERA_TRANSPORT in their environment).
  std::string transport = "tcp";
  // Every task's TESSERA_SESSION_PROTECTION: auto, on or off.
  std::string session_protection = "auto";
  // Where the ps tasks keep parameters (--memory), and whether they may
  // stage GPU-resident ones through host memory.
  std::string memory = "host";
  bool allow_host_staging = false;
  // Run the coordinator as its own task instead of inside ps task 0.
  bool separate_coordinator = false;
  // Extra arguments for each `tessera server` child.
  std::vector<std::string> server_args;
  // Checkpoints (passed to the servers); the coordinator is stopped first, so
  // that it can take a final checkpoint while the shards still serve.
  std::string checkpoint_dir;
  double checkpoint_secs = 0;
  uint64_t checkpoint_steps = 0;
  int keep_checkpoints = 0;  // 0: the server's default
  bool no_restore = false;
  bool new_run = false;
  // The worker command; every worker runs it.
  std::vector<std::string> worker_command;
  // A task that fails is started again, with the same command and
  // environment (its address, so its peers reconnect), up to this many
  // times; 0: the first failure stops the cluster.
  int max_restarts = 0;
  int ps_ready_timeout_s = 30;
};

// Returns the exit code: 0 when every worker exited 0.
int Launch(const LaunchOptions& options);

// This executable's path (for starting `tessera server` children).
std::string SelfExecutable();

// Starts argv with extra environment entries ("K=V"), pinned to `cpu` when
// >= 0, its output inherited or, with `quiet`, discarded. The child dies
// with this process.
int SpawnProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env, int cpu,
                 bool quiet = false);

// A free TCP port on host (nothing listens on it right now).
uint16_t FreePort(const std::string& host);

}  // namespace tessera::tools
