// The shard's part in membership, restore and checkpoint rounds (see
// coord/checkpointer.h for the round as a whole).
#include <fmt/format.h>

#include "core/log.h"
#include "kernels/update.h"
#include "server/shard.h"

namespace tessera::server {

using namespace std::chrono_literals;

// ---------------------------------------------------------------------------
// The coordinator's side

void Shard::OnCheckpointFrame(std::span<const uint8_t> frame) {
  if (!stopping_) checkpoints_->OnFrame(frame);
}

void Shard::OnHostedJoined(const wire::JoinReply& reply) {
  if (!stopping_) FirstJoined(reply);
}

void Shard::FirstJoined(const wire::JoinReply& reply) {
  if (!reply.restore_path.empty()) {
    Status st = OpenRestore(reply.restore_path, reply.global_step);
    if (!st.ok()) {
      TLOG_ERROR("cannot restore from {}: {}; tensors start uninitialised", reply.restore_path,
                 st.message());
    }
  }
  joined_ = true;
  ServeDeferredCreates();
}

uint64_t Shard::SyncStepReached() const {
  uint64_t step = 0;
  table_->ForEach([&](const Param& p) {
    if (p.initialized && p.entry.tensor.mode.kind == Consistency::kSync)
      step = std::max(step, p.step);
  });
  return step;
}

std::vector<MessageBytes> Shard::JoinFrames() {
  std::vector<wire::Join> joins(1);
  joins.back().more = true;  // the join's end follows them
  table_->ForEach([&](const Param& p) {
    if (joins.back().chunks.size() == wire::Join::kMaxChunks) {
      joins.emplace_back();
      joins.back().more = true;
    }
    wire::CreateEntry e = p.entry;
    e.tensor.hyper = p.hyper;  // as set at run time
    joins.back().chunks.push_back(std::move(e));
    joins.back().initialized.push_back(p.initialized ? 1 : 0);
  });
  // The chunks, then the last sync steps reported (a restarted coordinator
  // counts the global step from them; one that lived ignores steps it
  // counted) and those counted while the link was down, then the join's
  // end: the coordinator answers workers once every ps task got that far,
  // so its global step is whole by then.
  std::vector<MessageBytes> frames;
  for (const auto& join : joins) frames.push_back(wire::Encode(join, 3));
  steps_->AppendJoinFrames(&frames);
  wire::Join end;
  end.sync_step = SyncStepReached();
  frames.push_back(wire::Encode(end, 3));
  return frames;
}

// ---------------------------------------------------------------------------
// A ps task's link to the coordinator

void Shard::OpenCoordinatorLink() {
  CoordinatorLink::Options o{.cluster = options_.cluster,
                             .task_index = options_.task_index,
                             .secret = options_.secret,
                             .protection = options_.session_protection,
                             .hello_deadline = sessions_->hello_deadline()};
  CoordinatorLink::Events events{
      .join = [this] { return JoinFrames(); },
      .joined = [this](const wire::JoinReply& reply) { OnJoined(reply); },
      .checkpoint = [this](std::span<const uint8_t> frame) { checkpoints_->OnFrame(frame); },
      // This task's end may have waited for the coordinator's, and whoever
      // waits for its stop waits no more.
      .coordinator_stops = [this] { lent_.coordinator_stopped(); },
      .acked =
          [this](uint64_t request_id) {
            if (request_id == ByeRound::kRequestId) lent_.bye->Answered(link_->endpoint());
          },
      .closed =
          [this] {
            lent_.coordinator_stopped();
            if (!stopping_) checkpoints_->Abandon();
          },
  };
  link_ = std::make_unique<CoordinatorLink>(*ctx_, std::move(o), std::move(events));
}

void Shard::OnJoined(const wire::JoinReply& reply) {
  steps_->Flush();  // what was counted since the join went
  if (joined_) {
    TLOG_INFO("rejoined the coordinator");
    return;
  }
  TLOG_INFO("joined the coordinator (global step {})", reply.global_step);
  FirstJoined(reply);
}

void Shard::ServeDeferredCreates() {
  auto deferred = std::move(deferred_creates_);
  deferred_creates_.clear();
  for (auto& [ep, request_id, msg] : deferred) {
    if (Peer* peer = sessions_->Find(ep.get())) OnCreate(*peer, request_id, msg);
  }
}

bool Shard::OnLinkFrame(const transport::Endpoint* ep, std::span<const uint8_t> frame) {
  if (!link_ || !link_->carries(ep)) return false;
  link_->OnFrame(frame);
  return true;
}

bool Shard::OnLinkClosed(const transport::Endpoint* ep, const Status& why) {
  if (!link_ || !link_->carries(ep)) return false;
  link_->OnClosed(why);
  return true;
}

void Shard::SayByeToCoordinator() {
  if (!link_ || link_->endpoint() == nullptr || !joined_) return;
  link_->Send(wire::Encode(wire::Bye{}, ByeRound::kRequestId));
  lent_.bye->Await(link_->endpoint());
}

bool Shard::coordinator_gone() const {
  return !link_ || link_->coordinator_said_bye() || !link_->joined();
}

// ---------------------------------------------------------------------------
// Restore

Status Shard::OpenRestore(const std::string& path, uint64_t step) {
  auto c = ckpt::Checkpoint::Open(path, {.verify_data = false,
                                         .accept_legacy = options_.accept_legacy_checkpoints,
                                         .key = lent_.checkpoint_key});
  if (!c.ok()) return c.status();
  restore_ = std::make_unique<ckpt::Checkpoint>(std::move(*c));
  restore_step_ = step;
  TLOG_INFO("tensors are restored from {} as they are created (sync tensors resume at step {})",
            path, step);
  return Status::Ok();
}

void Shard::RestoreChunk(Param& p) {
  const auto& t = p.entry.tensor;
  const ckpt::TensorRecord* rec = restore_->Find(t.name);
  if (rec == nullptr) return;
  if (rec->dtype != t.dtype || rec->shape != t.shape) {
    TLOG_WARN("'{}' is {} in {} but is now declared {}: not restored (the chief initialises it)",
              t.name, DescribeTensor(rec->dtype, rec->shape), restore_->path,
              DescribeTensor(t.dtype, t.shape));
    return;
  }
  const uint64_t first = p.entry.elem_offset;
  // Reads a slot into the shard's memory: directly into host memory, through
  // a host buffer into a GPU's.
  std::vector<uint8_t> host;
  auto read = [&](ckpt::Slot slot, uint64_t offset, uint64_t bytes, uint8_t* dst) -> Status {
    if (memory_->is_host()) return restore_->ReadSlot(t.name, slot, offset, bytes, dst);
    host.resize(bytes);
    TESSERA_RETURN_IF_ERROR(restore_->ReadSlot(t.name, slot, offset, bytes, host.data()));
    return memory_->FromHost(dst, host.data(), bytes);
  };
  Status st = read(ckpt::Slot::kParam, first * DTypeSize(t.dtype), p.bytes, p.data);
  const bool same_rule = rec->rule == t.rule;
  if (st.ok() && same_rule) {
    const uint64_t ssize = kernels::StateElementSize(t.dtype);
    if (st.ok() && !p.state0.empty())
      st = read(ckpt::Slot::kState0, first * ssize, p.state0.size(), p.state0.data());
    if (st.ok() && !p.state1.empty())
      st = read(ckpt::Slot::kState1, first * ssize, p.state1.size(), p.state1.data());
    if (st.ok() && !p.master.empty())
      st = read(ckpt::Slot::kMaster, first * 4, p.master.size(), p.master.data());
  }
  if (st.ok()) st = Publish(p);
  if (!st.ok()) {
    TLOG_ERROR("'{}' not restored: {}", p.display_name, st.message());
    Status zeroed = memory_->Zero(p.data, p.bytes);
    if (zeroed.ok()) zeroed = Publish(p);
    if (!zeroed.ok()) TLOG_ERROR("'{}': {}", p.display_name, zeroed.message());
    return;
  }
  if (same_rule) {
    p.updates = rec->updates;
  } else {
    TLOG_WARN(
        "'{}' was saved with rule {} and is now declared with {}: its value is restored, "
        "its optimizer state starts afresh",
        t.name, UpdateRuleName(rec->rule), UpdateRuleName(t.rule));
    if (Status reset = memory_->ResetRuleState(t.rule, p.hyper, t.dtype, p.data, p.entry.elem_count,
                                               p.rule_state());
        !reset.ok()) {
      TLOG_ERROR("'{}': optimizer state not reset: {}", p.display_name, reset.message());
    }
    p.updates = 0;
  }
  p.version = 1;
  p.initialized = true;
  if (t.mode.kind == Consistency::kSync) {
    p.step = restore_step_;
    p.resume_at_first_push = true;
    p.resuming = true;
  }
  std::fill(p.pushed_steps.begin(), p.pushed_steps.end(), restore_step_);
  chunks_restored_++;
}

// ---------------------------------------------------------------------------
// Messages to the coordinator (checkpoint rounds: checkpoint_participant.h)

void Shard::SendToCoordinator(MessageBytes frame) {
  if (coordinator() != nullptr) coordinator()->Send(std::move(frame));
}

}  // namespace tessera::server
