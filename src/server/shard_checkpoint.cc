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
  auto restorer = ChunkRestorer::Open(path, step,
                                      {.verify_data = false,
                                       .accept_legacy = options_.accept_legacy_checkpoints,
                                       .key = lent_.checkpoint_key});
  if (!restorer.ok()) return restorer.status();
  restorer_ = std::move(*restorer);
  TLOG_INFO("tensors are restored from {} as they are created (sync tensors resume at step {})",
            path, step);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Messages to the coordinator (checkpoint rounds: checkpoint_participant.h)

void Shard::SendToCoordinator(MessageBytes frame) {
  if (coordinator() != nullptr) coordinator()->Send(std::move(frame));
}

}  // namespace tessera::server
