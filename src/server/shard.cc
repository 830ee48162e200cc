// The shard's life (open, serve, stop) and its requests, each handed to the
// table serving its opcode. The rest of the shard: shard_workers (a worker's
// arrival and end), shard_status; its units (shard.h) hold the rest.
#include "server/shard.h"

#include "core/log.h"
#include "server/dense_table.h"
#include "server/row_tables.h"

namespace tessera::server {

Shard::~Shard() = default;

Status Shard::Open() {
  auto memory = ShardMemory::Open(options_, *ctx_);
  if (!memory.ok()) return memory.status();
  memory_ = std::move(*memory);
  if (!options_.checkpoint_dir.empty()) {
    // Every ps task writes its own file there: found out now, not when the
    // first round fails (a read-only or missing mount used to go unnoticed
    // until the end of training).
    TESSERA_RETURN_IF_ERROR(ckpt::CheckWritableDirectory(options_.checkpoint_dir));
  }
  membership_.emplace(
      CoordinatorMembership::Lent{ctx_, &options_, sessions_, &tables_, lent_.bye, lent_.hosted},
      CoordinatorMembership::Events{
          .first_joined = [this](const wire::JoinReply& reply) { tables_.Ready(reply); },
          .checkpoint = [this](std::span<const uint8_t> frame) { checkpoints_->OnFrame(frame); },
          .coordinator_stopped = [this] { lent_.coordinator_stopped(); },
          .link_closed = [this] { checkpoints_->Abandon(); }});
  checkpoints_ = std::make_unique<CheckpointParticipant>(
      tables_, *ctx_,
      CheckpointParticipant::Options{
          .task = TaskId{"ps", options_.task_index}.ToString(),
          .round_timeout = options_.checkpoint_timeout,
          .send_to_coordinator =
              [this](MessageBytes f) { membership_->coordinator().Send(std::move(f)); },
          .resumed = [this] { RetryWaiting(); }});
  TESSERA_RETURN_IF_ERROR(tables_.Add(
      std::make_unique<DenseTable>(DenseTable::Lent{.options = &options_,
                                                    .ctx = ctx_,
                                                    .sessions = sessions_,
                                                    .roster = lent_.roster,
                                                    .memory = memory_.get(),
                                                    .hosted = lent_.hosted,
                                                    .checkpoint_key = lent_.checkpoint_key,
                                                    .checkpoints = checkpoints_.get(),
                                                    .steps = &membership_->steps()})));
  return tables_.Add(std::make_unique<RowTables>(
      RowTables::Lent{.options = &options_, .ctx = ctx_, .sessions = sessions_}));
}

void Shard::Begin() {
  tables_.Begin();
  membership_->Begin();
}

std::string Shard::DescribeMemory() const { return memory_->Describe(); }

bool Shard::Serves(wire::Opcode op) {
  switch (op) {
    case wire::Opcode::kCreate:
    case wire::Opcode::kPush:
    case wire::Opcode::kPull:
    case wire::Opcode::kRelease:
    case wire::Opcode::kSetHyper:
    case wire::Opcode::kGetState:
    case wire::Opcode::kSetState:
    case wire::Opcode::kSyncStep:
    case wire::Opcode::kCreateTable:
    case wire::Opcode::kRowsPull:
    case wire::Opcode::kRowsPush:
      return true;
    default:
      return false;
  }
}

void Shard::OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  if (Table* table = tables_.For(h.opcode)) return table->OnRequest(peer, h, frame);
  if (h.opcode == wire::Opcode::kSyncStep) {
    if (auto m = wire::DecodeBody<wire::SyncStep>(h, frame); !m.ok()) {
      return sessions_->SendError(peer, h.request_id, m.status().WithContext("sync-step refused"));
    }
    return peer.ep->Send(wire::kProtocolMsg,
                         wire::Encode(wire::StepReply{tables_.SyncStepReached()}, h.request_id));
  }
  sessions_->Drop(peer,
                  Status::Internal(std::string(wire::OpcodeName(h.opcode)) +
                                   " routed to the shard, which does not serve it"),
                  h.request_id);
}

bool Shard::OnLinkFrame(const transport::Endpoint* ep, std::span<const uint8_t> frame) {
  return membership_ && membership_->OnLinkFrame(ep, frame);
}

bool Shard::OnLinkClosed(const transport::Endpoint* ep, const Status& why) {
  return membership_ && membership_->OnLinkClosed(ep, why);
}

void Shard::OnCheckpointFrame(std::span<const uint8_t> frame) {
  if (!stopping_) checkpoints_->OnFrame(frame);
}

void Shard::OnHostedJoined(const wire::JoinReply& reply) {
  if (!stopping_) membership_->OnHostedJoined(reply);
}

void Shard::SayByeToCoordinator() {
  if (membership_) membership_->SayBye();
}

bool Shard::coordinator_gone() const { return !membership_ || membership_->coordinator_gone(); }

void Shard::StopServing() {
  stopping_ = true;
  if (membership_) membership_->Stop();
  if (checkpoints_) checkpoints_->Stop();
  tables_.Stop();
}

void Shard::JoinWriter() {
  if (checkpoints_) checkpoints_->JoinWriter();
}

void Shard::Release() {
  membership_.reset();
  checkpoints_.reset();
  tables_.Release();  // regions outlive their context safely (they hold the ucp context)
}

}  // namespace tessera::server
