// A parameter-server shard: `tessera server --job ps --task K` runs one.
// Like tf.train.Server: it serves until Stop() (or a signal, in the tool).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/cluster.h"
#include "tessera/export.h"
#include "tessera/status.h"

namespace tessera {

struct TESSERA_EXPORT ServerOptions {
  ClusterSpec cluster;
  // "ps" for a shard; "coordinator" for a coordinator that holds no
  // parameters (the cluster spec's one "coordinator" task). Without a
  // "coordinator" job in the spec, ps task 0 embeds the coordinator.
  std::string job = "ps";
  int task_index = 0;              // which task of the job this is
  std::string secret;              // the cluster secret (see LoadSecret), at least 16 bytes
  bool allow_weak_secret = false;  // accept a shorter one (TESSERA_ALLOW_WEAK_SECRET=1)
  // "tcp" (Tessera's own sockets), "ucx" (shared memory, RDMA; its tcp only
  // on loopback, see docs/security.md), "verbs", or "auto".
  std::string transport = "tcp";
  // Whether sessions are authenticated and encrypted after their handshake
  // (tcp only; kAuto: on for connections that leave the host).
  SessionProtection session_protection = SessionProtection::kAuto;
  // Listen on this host instead of the spec's (e.g. "0.0.0.0"); port from the spec.
  std::string bind_host;
  // Listen on this port instead of the spec's (a task reached through a
  // port forward or a relay); 0: the spec's.
  uint16_t bind_port = 0;
  // A connection must prove it knows the secret within this time
  // (TESSERA_HELLO_TIMEOUT_MS overrides it; TESSERA_TIMEOUT_SCALE scales it).
  std::chrono::milliseconds hello_timeout{5000};
  // At most this many connections that have not yet authenticated, a
  // quarter of them from strangers (addresses that are no task's in the
  // spec); a new one closes the oldest (docs/security.md, "Strangers").
  size_t max_unauthenticated = 256;
  // The bytes parameters, optimizer state and step sums may take (0: what
  // the memory had free at start). A create past it is refused, naming it.
  uint64_t memory_limit_bytes = 0;
  // Each worker's staging slot: the only memory it may write.
  size_t staging_bytes_per_worker = 32u << 20;
  // Parameters are laid out in arenas of at least this size.
  size_t arena_bytes = 64u << 20;
  // A pull lease not released within this time is revoked (and logged), so a
  // worker that stalls between its pull reply and its release cannot block
  // updates forever.
  std::chrono::milliseconds lease_timeout{30'000};
  // Where parameters, optimizer state and step sums live: "host", "cuda"
  // (GPU 0) or "cuda:N". GPU memory needs a fabric that can reach it (a
  // CUDA-capable UCX; verbs with dmabuf or peer memory), unless
  // allow_host_staging lets workers reach host copies instead (counted in
  // ServerStats::host_staged_bytes). See docs/gpu.md.
  std::string memory = "host";
  bool allow_host_staging = false;
  // Log small tensors' values as they change (the demo uses it).
  bool log_updates = false;
  bool busy_poll = false;
  // Otherwise, how long the progress thread keeps polling after its last
  // work before it sleeps. A worker's next request often follows the reply
  // after it moved a large tensor, long enough for a shard to fall asleep:
  // one asleep by then pays a wake-up on every such push. The
  // spin stops at once when the thread finds itself descheduled (a CPU hog
  // on its core), so a busy host gets its core back.
  std::chrono::microseconds spin_before_sleep{200};

  // Checkpoints, used by the coordinator (ps task 0, or the coordinator
  // task); the other tasks ignore them. The directory must be shared by all
  // ps tasks (each writes its own file into it). Empty: no checkpoints.
  std::string checkpoint_dir;
  std::chrono::milliseconds checkpoint_every{0};  // also every this long (0: never)
  uint64_t checkpoint_every_steps = 0;            // also every N global steps (0: never)
  int keep_checkpoints = 5;                       // complete checkpoints kept
  // Resume from the newest complete checkpoint in checkpoint_dir, if any.
  bool restore = true;
  // Also restore a version-1 checkpoint (written before digests; one edited
  // to look so is the same to a reader): refused otherwise.
  bool accept_legacy_checkpoints = false;
  // Start a new run in checkpoint_dir: an earlier run's checkpoints there
  // are moved aside (into earlier-run-<UTC time>/, not deleted) and nothing
  // is restored. Without it, restore = false refuses a directory that holds
  // checkpoints: the two runs would mix.
  bool new_run = false;
  // A round not finished within this time is abandoned (and logged).
  std::chrono::milliseconds checkpoint_timeout{120'000};

  // For a server an engine started (tessera run): WaitUntilWorkersLeave
  // returns once the job's workers are done with it, so that it can end as
  // the engine expects. A worker rank that never connects is waited for
  // this long after the last one left.
  bool stop_when_workers_leave = false;
  std::chrono::milliseconds workers_grace{60'000};

  // A sync step whose waiting pulls need a worker that disconnected waits
  // this long for it to come back (a restarted worker resumes at the same
  // step) before failing them, naming it. Without it, workers restarted one
  // after the other failed at once, each blaming the one not yet back.
  std::chrono::milliseconds worker_rejoin_grace{10'000};
};

struct TESSERA_EXPORT ServerStats {
  uint64_t tensors = 0;  // chunks held
  uint64_t pushes_applied = 0;
  uint64_t pulls_served = 0;
  uint64_t connections_refused = 0;       // failed authentication or malformed messages
  uint64_t leases_revoked = 0;            // pull leases not released within lease_timeout
  uint64_t sync_steps_applied = 0;        // sync chunks' steps applied
  uint64_t stale_pushes_dropped = 0;      // sync: pushed chunks for an applied step
  uint64_t duplicate_pushes_dropped = 0;  // sync: a worker's second push of a step
  uint64_t chunks_restored = 0;           // chunks loaded from a checkpoint
  uint64_t checkpoints_written = 0;       // coordinator: complete checkpoints written
  uint64_t checkpoint_rounds_failed = 0;  // coordinator: rounds abandoned (logged as errors)
  std::string last_checkpoint_failure;    // coordinator: what the last of them said
  // GPU memory with --allow-host-staging: bytes copied between the GPU and
  // the host copies workers reach (gradients in, values out).
  uint64_t host_staged_bytes = 0;
  // Workers on this node given CUDA IPC handles (GPU memory only).
  uint64_t cuda_ipc_workers = 0;
  // Times a worker rank lost its last connection (left, died, restarted).
  uint64_t worker_departures = 0;
  // Coordinator: the step reports each ps task sent it (the shards count the
  // global step: at most one report per ps task per sync step), and step
  // messages workers sent it (none: they are refused).
  std::vector<uint64_t> step_reports_from_ps;
  uint64_t step_messages_from_workers = 0;
};

class TESSERA_EXPORT Server {
 public:
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  uint16_t port() const;
  ServerStats stats() const;
  // Stops serving; connections are closed.
  void Stop();
  // With ServerOptions::stop_when_workers_leave: blocks until every worker
  // has left, OK when all said bye, else an error naming the workers lost or
  // never seen (a task that hosts no coordinator also waits for the
  // coordinator to stop first, so that its final checkpoint finds this task
  // serving). Returns at once, with an error, without that option.
  Status WaitUntilWorkersLeave();
  // The same, waiting at most `limit`: the verdict, or nothing yet (for a
  // caller that must stay responsive, such as Python's Ctrl-C, and waits in
  // slices).
  std::optional<Status> WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit);
  // A task that does not host the coordinator, asked to stop, should let
  // the coordinator stop first: its final checkpoint needs every shard
  // serving. Waits at most `limit` for the coordinator to say it stops (or
  // for the link to it to go); true if it did, or this task hosts it.
  bool WaitForCoordinatorToStop(std::chrono::milliseconds limit);

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
