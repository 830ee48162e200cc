// What a shard reports: `tessera status` JSON and ServerStats.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/heap_counter.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "server/shard.h"

namespace tessera::server {

std::string Shard::StatusJson() const {
  const ServerStats s = stats();
  nlohmann::json workers = nlohmann::json::array();
  nlohmann::json readers = nlohmann::json::array();
  sessions_->ForEach([&](const Peer& peer) {
    if (!peer.authenticated || peer.is_shard || peer.is_observer) return;
    if (peer.is_reader) {
      readers.push_back({{"task", peer.hello.task}, {"address", peer.ep->peer()}});
      return;
    }
    workers.push_back({{"task", peer.hello.task},
                       {"address", peer.ep->peer()},
                       {"cuda_ipc", peer.ipc_slot != nullptr}});
  });
  nlohmann::json j = {{"task", TaskId{options_.job, options_.task_index}.ToString()},
                      {"coordinator", hosts_coordinator()},
                      {"transport", ctx_->Describe()},
                      {"memory", memory_->Describe()},
                      {"staged_through_host", table_->staged()},
                      {"workers", workers},
                      {"readers", readers},
                      {"stats",
                       {{"tensors", s.tensors},
                        {"pushes_applied", s.pushes_applied},
                        {"pulls_served", s.pulls_served},
                        {"connections_refused", s.connections_refused},
                        {"leases_revoked", s.leases_revoked},
                        {"sync_steps_applied", s.sync_steps_applied},
                        {"stale_pushes_dropped", s.stale_pushes_dropped},
                        {"duplicate_pushes_dropped", s.duplicate_pushes_dropped},
                        {"chunks_restored", s.chunks_restored},
                        {"checkpoints_written", s.checkpoints_written},
                        {"host_staged_bytes", s.host_staged_bytes},
                        {"cuda_ipc_workers", s.cuda_ipc_workers},
                        {"worker_departures", s.worker_departures}}}};
  // Only where the process counts them (the `tessera` tool does): the
  // bench's figure of the shard's allocations per call.
  if (const auto allocations = HeapAllocationsSoFar()) j["heap_allocations"] = *allocations;
  if (hosted_) {
    j["global_step"] = hosted_->global_step();
    // What the coordinator was told of steps, and by whom: the shards count
    // them, at most one report per ps task per sync step; workers say none.
    j["step_reports"] = {{"from_ps_tasks", s.step_reports_from_ps},
                         {"from_workers", step_messages_from_workers_.load()}};
  }
  return j.dump();
}

ServerStats Shard::stats() const {
  ServerStats s;
  s.tensors = tensors_;
  s.pushes_applied = pushes_applied_;
  s.pulls_served = pulls_served_;
  s.connections_refused = sessions_ ? sessions_->refused() : 0;
  s.leases_revoked = leases_revoked_;
  s.sync_steps_applied = steps_applied_;
  s.stale_pushes_dropped = stale_dropped_;
  s.duplicate_pushes_dropped = duplicate_dropped_;
  s.chunks_restored = chunks_restored_;
  if (hosted_) hosted_->AddStats(&s);
  s.host_staged_bytes = host_staged_bytes_;
  s.cuda_ipc_workers = cuda_ipc_workers_;
  s.step_messages_from_workers = step_messages_from_workers_;
  s.worker_departures = roster_.departures();
  return s;
}

}  // namespace tessera::server
