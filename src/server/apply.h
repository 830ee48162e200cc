// How a push changes one chunk, by consistency mode: small functions over a
// Param and the shard's memory, with no connection, message or lease in
// sight. The shard decides when a push may apply (leases, the checkpoint
// freeze, a sync step ahead of the cluster); these say what applying does.
#pragma once

#include <atomic>
#include <cstdint>

#include "server/param_memory.h"
#include "server/param_table.h"
#include "wire/messages.h"

namespace tessera::server::apply {

// Where values change: the shard's memory, and whether workers read a host
// copy (staging) that must follow every change; staged_bytes counts what was
// copied for it.
struct Target {
  ParamMemory* memory = nullptr;
  bool staged = false;
  std::atomic<uint64_t>* staged_bytes = nullptr;
  bool host = false;  // memory->is_host(), asked once
};

// The host copy workers read follows the value (staging only).
Status Publish(const Target& t, Param& p);
// The chunk's value into host memory (an inline pull, a log line): the host
// copy where values are staged, else from the memory.
Status ReadValue(const Target& t, const Param& p, void* host_dst);

// The chief's initial value (or a restored one): assigned, the optimizer
// state starts afresh, any failed sync step is forgotten. Version + 1. A
// sync or bounded chunk starts no earlier than cluster_step, the global step
// the chief initialised at.
Status Init(const Target& t, Param& p, const void* value, uint64_t cluster_step);

// A gradient through the tensor's update rule (async and bounded pushes, and
// a sync step's aggregate). Version + 1 when it applied.
Status Gradient(const Target& t, Param& p, const void* grad);
// Gradient where it cannot fail: host memory that is not staged, and a rule
// that is no optimizer (assign, add). No virtual call and no Status: in a
// batch of small chunks these cost as much as the update itself.
inline bool TakesPlainGradient(const Target& t, const Param& p) {
  return t.host && !t.staged && !IsOptimizer(p.rule);
}
void PlainGradient(Param& p, const void* grad);

// Bounded: worker `rank` has pushed its step `step`.
void NoteBoundedStep(Param& p, uint32_t rank, uint64_t step);

// Sync: worker `rank`'s gradient for step `step` joins the step's sum, or is
// dropped as stale (that step applied, or has its replicas already) or as a
// duplicate (this worker's part of the step is in). `*step_ready` turns true
// when this part completed the step's replicas: then ApplySyncStep applies it.
struct SyncPart {
  Status status;
  wire::PushOutcome outcome = wire::PushOutcome::kApplied;
  bool step_ready = false;
};
SyncPart AddToSyncStep(const Target& t, Param& p, uint32_t rank, uint64_t step, const void* grad);

// Sync: the step's aggregate (averaged if the mode says so) goes through the
// update rule, and the chunk moves to the next step whatever the outcome;
// the caller records a failure (Param::failure) with the step's pushers.
// `injected`: a failure to report instead of applying (the tests' failpoint).
Status ApplySyncStep(const Target& t, Param& p, const Status& injected = Status::Ok());

}  // namespace tessera::server::apply
