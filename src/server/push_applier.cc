#include "server/push_applier.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/borrowed.h"
#include "core/dtype.h"
#include "core/log.h"

namespace tessera::server {
namespace {

bool NeedsNoLease(const Param& p, uint32_t flags) {
  // A sync push only adds to the step's sum; the parameter changes when the
  // step applies (ApplyAggregated), which waits for readers itself.
  return !(flags & wire::kFlagInit) && p.kind == Consistency::kSync;
}

// Whether a push may apply now.
enum class Gate {
  kApply,
  kWait,    // a reader holds a chunk, or the push is ahead of a sync chunk's step
  kFailed,  // a chunk's sync step failed: `*failed` says how
};

// Looks each entry's chunk up once (into `params`, for the apply loop) and
// says whether the push may apply now. `holds_sync`: some entry is a sync
// chunk.
Gate CheckEntries(ParamTable& table, const wire::Push& msg, uint32_t flags,
                  std::vector<Param*>& params, bool* holds_sync, const Param** failed) {
  const bool init = flags & wire::kFlagInit;
  params.resize(msg.entries.size());
  for (size_t i = 0; i < msg.entries.size(); ++i) {
    Param* p = params[i] = table.Find(msg.entries[i].key_id);
    *holds_sync |= p->kind == Consistency::kSync;
    if (p->resume_at_first_push) {
      // A sync chunk restored without knowing the cluster's exact step
      // resumes at the step its first push is for, when that is later.
      if (!init && msg.step > p->step) {
        TLOG_INFO("'{}' resumes at step {} (restored at {})", p->display_name, msg.step, p->step);
        p->step = msg.step;
      }
      p->resume_at_first_push = false;
    }
    if (!init && p->failed) {
      *failed = p;
      return Gate::kFailed;
    }
    if (NeedsNoLease(*p, flags)) {
      if (msg.step > p->step) return Gate::kWait;  // ahead of the cluster: wait for the step
    } else if (p->readers > 0) {
      return Gate::kWait;
    }
  }
  return Gate::kApply;
}

// `*grad` where the kernels can read it: a shard in GPU memory copies a
// gradient that came inline or through a host staging slot there. (Host
// memory reads it where it is, with no call and no Status per entry.)
Status Reach(ParamMemory& memory, const void** grad, uint64_t bytes) {
  auto reachable = memory.Reachable(*grad, bytes);
  if (!reachable.ok()) return reachable.status();
  *grad = *reachable;
  return Status::Ok();
}

// The reply's lists emptied for `entries` more, their capacity kept.
void ResetReply(wire::PushReply& reply, size_t entries) {
  reply.versions.clear();
  reply.outcomes.clear();
  reply.refusals.clear();
  reply.versions.reserve(entries);
  reply.outcomes.reserve(entries);
}

// One entry's value (init) or gradient, by the chunk's consistency mode:
// its outcome, `*error` set only when it failed (a loop over a batch makes no
// Status per entry), `*step_ready` when a sync step is complete.
wire::PushOutcome ApplyEntry(const apply::Target& target, Param& p, const void* grad, bool init,
                             uint32_t rank, uint64_t step, Status* error, bool* step_ready) {
  if (init) {
    *error = apply::Init(target, p, grad, step);
    return wire::PushOutcome::kApplied;
  }
  if (p.kind == Consistency::kSync) {
    auto part = apply::AddToSyncStep(target, p, rank, step, grad);
    if (!part.status.ok()) *error = std::move(part.status);
    *step_ready = part.step_ready;
    return part.outcome;
  }
  if (apply::TakesPlainGradient(target, p)) {
    apply::PlainGradient(p, grad);
  } else if (Status st = apply::Gradient(target, p, grad); !st.ok()) {
    *error = std::move(st);
  }
  if (p.kind == Consistency::kBounded) apply::NoteBoundedStep(p, rank, step);
  return wire::PushOutcome::kApplied;
}

// `d`: the chunk's value, in host memory.
std::string FormatValues(const Param& p, const uint8_t* d) {
  std::string out;
  for (uint64_t i = 0; i < p.entry.elem_count; ++i) {
    if (i) out += ", ";
    switch (p.entry.tensor.dtype) {
      case DType::kF32:
        out += fmt::format("{:.6g}", reinterpret_cast<const float*>(d)[i]);
        break;
      case DType::kF64:
        out += fmt::format("{:.10g}", reinterpret_cast<const double*>(d)[i]);
        break;
      case DType::kF16:
        out += fmt::format("{:.4g}", HalfToFloat(reinterpret_cast<const uint16_t*>(d)[i]));
        break;
      case DType::kBF16:
        out += fmt::format("{:.4g}", BFloat16ToFloat(reinterpret_cast<const uint16_t*>(d)[i]));
        break;
      case DType::kI32:
        out += std::to_string(reinterpret_cast<const int32_t*>(d)[i]);
        break;
      case DType::kI64:
        out += std::to_string(reinterpret_cast<const int64_t*>(d)[i]);
        break;
    }
  }
  return p.entry.elem_count == 1 ? out : "[" + out + "]";
}

}  // namespace

bool PushApplier::Serve(Peer& peer, uint64_t request_id, uint32_t flags, wire::Push msg) {
  Status st = Validate(peer, flags, msg);
  if (!st.ok()) {
    lent_.sessions->SendError(peer, request_id, st);
    return false;
  }
  Held push{&peer, request_id, flags, std::move(msg)};
  if (!TryApply(push)) {
    held_.push_back(std::move(push));
    MarkWaitingWriters();
    return false;
  }
  spares_.Give(std::move(push.msg));
  return true;
}

bool PushApplier::ResumeForPull(const Peer& peer, const wire::Pull& pull) {
  if (peer.hello.role != wire::PeerRole::kWorker) return false;
  const uint32_t rank = peer.hello.task_index;
  bool moved = false;
  for (const auto& e : pull.entries) {
    Param* p = lent_.table->Find(e.key_id);
    if (!p->resuming || p->kind != Consistency::kSync || e.min_step <= p->step) continue;
    // The step after the one its lost push was for, or one more where the
    // restored step is the coordinator's estimate, one short (param_table.h).
    // Further is no lost push but a pull for a later step: it waits.
    if (e.min_step - p->step > 2) continue;
    if (rank >= p->contributed.size() || p->contributed[rank]) continue;  // it waits for its step
    if (p->agg_count >= p->entry.tensor.mode.replicas_to_aggregate) continue;  // about to apply
    // What the step gathered since the restore is dropped with it: this
    // shard's updates since its checkpoint are lost (training.md), and now
    // this step's too. Pushes of the skipped steps are dropped as stale.
    TLOG_WARN(
        "'{}' resumes at step {} (restored at {}, {} of its gradients dropped): {} pulls it "
        "without pushing step {} again, which it pushed before this task restarted",
        p->display_name, e.min_step, p->step, p->agg_count, peer.hello.task, p->step);
    p->step = e.min_step;
    p->ResetAggregation();
    p->resuming = false;
    p->resume_at_first_push = false;
    moved = true;
  }
  return moved;
}

void PushApplier::PeerGone(const Peer& peer) {
  std::erase_if(held_, [&](const Held& p) { return p.peer == &peer; });
}

void PushApplier::ApplyWaiting() {
  // Updates first (writers have priority), then the pulls they unblock. An
  // applied sync step can unblock pushes for the next step, which can
  // complete that one: repeat until nothing moves.
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto it = pending_steps_.begin(); it != pending_steps_.end();) {
      bool applied = TryApplyStep(*lent_.table->Find(*it));
      moved |= applied;
      it = applied ? pending_steps_.erase(it) : std::next(it);
    }
    for (auto it = held_.begin(); it != held_.end();) {
      bool applied = TryApply(*it);
      moved |= applied;
      if (applied) spares_.Give(std::move(it->msg));
      it = applied ? held_.erase(it) : std::next(it);
    }
  }
  MarkWaitingWriters();
}

void PushApplier::AddStats(ServerStats* s) const {
  s->pushes_applied = applied_;
  s->sync_steps_applied = steps_applied_;
  s->stale_pushes_dropped = stale_dropped_;
  s->duplicate_pushes_dropped = duplicate_dropped_;
}

Status PushApplier::Validate(const Peer& peer, uint32_t flags, const wire::Push& msg) const {
  // The bytes are inline, or in the sender's staging slot (fabric or IPC).
  const bool inline_bytes = !msg.payload.empty();
  if (!inline_bytes && (flags & wire::kFlagIpcSlot) && peer.ipc_slot == nullptr) {
    return Status::FailedPrecondition("push from the CUDA IPC slot, but " + peer.hello.task +
                                      " was offered none");
  }
  // Only the chief initialises: an init push overwrites values and sets a
  // sync chunk's step, which no other worker may do.
  if ((flags & wire::kFlagInit) && peer.hello.task_index != 0) {
    return Status::PermissionDenied("an initialising push from " + peer.hello.task +
                                    ", which is not the chief (only the chief initialises)");
  }
  const bool then_pull = flags & wire::kFlagThenPull;
  if (then_pull && (!inline_bytes || (flags & wire::kFlagInit))) {
    return Status::InvalidArgument(
        "a push answered with the weights (push_pull) must carry its bytes inline and not "
        "initialise");
  }
  if (msg.step_parts > static_cast<uint32_t>(lent_.options->cluster.num_tasks("ps"))) {
    return Status::InvalidArgument("push whose step spans " + std::to_string(msg.step_parts) +
                                   " shards, but the cluster has " +
                                   std::to_string(lent_.options->cluster.num_tasks("ps")) +
                                   " ps tasks");
  }
  const uint64_t slot = inline_bytes ? msg.payload.size() : peer.staging->size();
  for (const auto& e : msg.entries) {
    const Param* p = lent_.table->Find(e.key_id);
    if (p == nullptr) return Status::NotFound("push to unknown key id " + std::to_string(e.key_id));
    if (e.byte_length != p->bytes) {
      return Status::InvalidArgument("push to tensor '" + p->display_name + "' (" +
                                     DescribeTensor(p->entry.tensor.dtype, p->entry.tensor.shape) +
                                     ", " + std::to_string(p->bytes) + " bytes) carries " +
                                     std::to_string(e.byte_length) + " bytes");
    }
    if (e.staging_offset > slot || e.byte_length > slot - e.staging_offset) {
      return Status::OutOfRange(
          "push to tensor '" + p->display_name + "' reads [" + std::to_string(e.staging_offset) +
          ", +" + std::to_string(e.byte_length) + ") outside the " + std::to_string(slot) +
          (inline_bytes ? " inline bytes" : "-byte staging slot"));
    }
    if (!(flags & wire::kFlagInit) && !p->initialized) {
      return Status::FailedPrecondition("tensor '" + p->display_name +
                                        "' is not initialised yet (the chief initialises it)");
    }
    if (then_pull && p->kind == Consistency::kSync) {
      return Status::InvalidArgument("push_pull of tensor '" + p->display_name +
                                     "', which is sync: its weights change when the step "
                                     "applies; push, then pull after the step");
    }
  }
  return Status::Ok();
}

bool PushApplier::TryApply(Held& push) {
  if (lent_.checkpoints->frozen()) return false;  // a checkpoint round is cutting the state
  const bool init = push.flags & wire::kFlagInit;
  // (Nothing the loops below call uses this scratch list.)
  std::vector<Param*>& params = params_;
  bool holds_sync = false;
  const Param* failed = nullptr;
  switch (CheckEntries(*lent_.table, push.msg, push.flags, params, &holds_sync, &failed)) {
    case Gate::kWait:
      return false;
    case Gate::kFailed:
      lent_.sessions->SendError(*push.peer, push.request_id, failed->failure());
      return true;
    case Gate::kApply:
      break;
  }
  const uint32_t rank = push.peer->hello.task_index;
  const bool from_slot = push.msg.payload.empty();
  const bool from_ipc = from_slot && (push.flags & wire::kFlagIpcSlot);
  const auto* staging = !from_slot ? push.msg.payload.data()
                        : from_ipc ? push.peer->ipc_slot
                                   : static_cast<const uint8_t*>(push.peer->staging->data());
  Borrowed<wire::PushReply> borrowed(reply_);
  wire::PushReply& reply = *borrowed;
  ResetReply(reply, push.msg.entries.size());
  const apply::Target& target = lent_.target;
  const bool count_staged = from_slot && !from_ipc && target.staged;
  const bool host_memory = target.host;
  for (size_t i = 0; i < push.msg.entries.size(); ++i) {
    const auto& e = push.msg.entries[i];
    Param* p = params[i];
    const void* grad = staging + e.staging_offset;
    Status error;  // stays empty, and costs nothing more, unless this entry fails
    if (!host_memory) error = Reach(*target.memory, &grad, e.byte_length);
    if (count_staged) *target.staged_bytes += e.byte_length;
    if (error.ok() && !init && entry_failpoint_.armed()) error = entry_failpoint_.Check();
    bool step_ready = false;
    auto outcome = wire::PushOutcome::kRefused;
    if (error.ok()) {
      outcome = ApplyEntry(target, *p, grad, init, rank, push.msg.step, &error, &step_ready);
    }
    if (outcome == wire::PushOutcome::kStale) stale_dropped_++;
    if (outcome == wire::PushOutcome::kDuplicate) duplicate_dropped_++;
    if (step_ready) pending_steps_.push_back(p->key_id);
    if (!error.ok()) {
      // This entry is refused; the batch's others still apply, and the
      // reply accounts for each.
      outcome = wire::PushOutcome::kRefused;
      reply.refusals.push_back({static_cast<uint32_t>(i), error.code(),
                                "tensor '" + p->display_name + "': " + error.message()});
    }
    p->writer_waiting = false;
    reply.versions.push_back(p->version);
    reply.outcomes.push_back(static_cast<uint8_t>(outcome));
    if (lent_.options->log_updates && p->elem_count <= 8 &&
        outcome == wire::PushOutcome::kApplied && p->kind != Consistency::kSync) {
      LogUpdate(*p, push.peer->hello.task);
    }
  }
  applied_++;
  Answer(push, reply);
  if (push.msg.step_parts > 0 && !init) CountStep(push, holds_sync);
  return true;
}

void PushApplier::Answer(const Held& push, const wire::PushReply& reply) {
  if (!(push.flags & wire::kFlagThenPull)) {
    push.peer->ep->Send(wire::kProtocolMsg, wire::Encode(reply, push.request_id));
  } else if (reply.refusals.empty()) {
    lent_.pulls->ServeWeights(*push.peer, push.request_id, push.msg, reply.versions);
  } else {
    // A push_pull's reply is the weights: the refusals go as its error.
    lent_.sessions->SendError(*push.peer, push.request_id, RefusalsStatus(push, reply));
  }
}

Status PushApplier::RefusalsStatus(const Held& push, const wire::PushReply& reply) const {
  std::string why = "push: " + std::to_string(reply.refusals.size()) + " of " +
                    std::to_string(push.msg.entries.size()) + " tensors refused (";
  for (size_t i = 0; i < reply.refusals.size(); ++i) {
    why += (i ? "; " : "") + reply.refusals[i].message;
  }
  why += "); the others were applied:";
  for (size_t i = 0; i < push.msg.entries.size(); ++i) {
    if (reply.outcomes[i] == static_cast<uint8_t>(wire::PushOutcome::kRefused)) continue;
    why += " '" + lent_.table->Find(push.msg.entries[i].key_id)->display_name + "' (version " +
           std::to_string(reply.versions[i]) + ")";
  }
  return Status(reply.refusals.front().code, why);
}

void PushApplier::CountStep(const Held& push, bool holds_sync) {
  if (!holds_sync) return lent_.steps->CountAsync();
  const uint32_t rank = push.peer->hello.task_index;
  for (const auto& e : push.msg.entries) {
    const auto& mode = lent_.table->Find(e.key_id)->entry.tensor.mode;
    if (mode.kind == Consistency::kSync) {
      return lent_.steps->CountSync(rank, push.msg.step, mode.replicas_to_aggregate,
                                    push.msg.step_parts);
    }
  }
}

bool PushApplier::TryApplyStep(Param& p) {
  if (p.readers > 0 || lent_.checkpoints->frozen()) return false;
  const auto& mode = p.entry.tensor.mode;
  // Who pushed the step, for its error: ApplySyncStep starts the next step.
  step_pushers_ = p.contributed;
  Status st = apply::ApplySyncStep(lent_.target, p, step_failpoint_.Check());
  if (!st.ok()) {
    std::string pushers;
    for (size_t rank = 0; rank < step_pushers_.size(); ++rank) {
      if (!step_pushers_[rank]) continue;
      if (!pushers.empty()) pushers += ", ";
      pushers += lent_.pulls->waits().WorkerName(static_cast<uint32_t>(rank));
    }
    p.SetFailure(Status(
        st.code(), "tensor '" + p.display_name + "': sync step " + std::to_string(p.step - 1) +
                       " (pushed by " + pushers +
                       ") could not be applied, so its value is not that step's: " + st.message() +
                       "; restart from the last checkpoint to go on"));
    TLOG_ERROR("{}", p.failure().message());
  }
  steps_applied_++;
  lent_.cut->StepApplied(p);
  if (lent_.options->log_updates && p.entry.elem_count <= 8) {
    LogUpdate(p, "step " + std::to_string(p.step - 1) + " of " +
                     std::to_string(mode.replicas_to_aggregate) + " workers");
  }
  return true;
}

void PushApplier::MarkWaitingWriters() {
  // Writers have priority: a tensor with an update waiting for its readers
  // takes no new readers.
  for (const auto& push : held_) {
    for (const auto& e : push.msg.entries) {
      Param* p = lent_.table->Find(e.key_id);
      if (!NeedsNoLease(*p, push.flags)) p->writer_waiting = true;
    }
  }
  for (uint32_t key : pending_steps_) lent_.table->Find(key)->writer_waiting = true;
}

void PushApplier::LogUpdate(const Param& p, const std::string& by) const {
  std::vector<uint8_t> value(p.bytes);
  if (Status st = apply::ReadValue(lent_.target, p, value.data()); !st.ok()) {
    TLOG_WARN("{}: cannot read its value to log it: {}", p.display_name, st.message());
    return;
  }
  TLOG_INFO("{} = {}  (version {}, {} by {})", p.display_name, FormatValues(p, value.data()),
            p.version, p.version == 1 ? "initialised" : UpdateRuleName(p.entry.tensor.rule), by);
}

}  // namespace tessera::server
