// The shard's life (open, serve, stop), its requests by opcode, and
// hyper-parameters. The rest of the shard: shard_workers (a worker's arrival
// and end), shard_status; its units (shard.h) hold the rest.
#include "server/shard.h"

#include "core/log.h"

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
  tables_ = std::make_unique<Tables>(
      std::make_unique<ParamTable>(ctx_, &memory_->memory(), memory_->arena_kind(),
                                   options_.arena_bytes, options_.cluster.num_workers()));
  ParamTable* dense = &tables_->dense();
  membership_.emplace(
      CoordinatorMembership::Lent{ctx_, &options_, sessions_, tables_.get(), lent_.bye,
                                  lent_.hosted},
      CoordinatorMembership::Events{
          .first_joined = [this](const wire::JoinReply& reply) { creates_->Ready(reply); },
          .checkpoint = [this](std::span<const uint8_t> frame) { checkpoints_->OnFrame(frame); },
          .coordinator_stopped = [this] { lent_.coordinator_stopped(); },
          .link_closed = [this] { checkpoints_->Abandon(); }});
  checkpoints_ = std::make_unique<CheckpointParticipant>(
      *tables_, memory_->memory(), *ctx_,
      CheckpointParticipant::Options{
          .task = TaskId{"ps", options_.task_index}.ToString(),
          .round_timeout = options_.checkpoint_timeout,
          .send_to_coordinator =
              [this](MessageBytes f) { membership_->coordinator().Send(std::move(f)); },
          .resumed = [this] { RetryWaiting(); }});
  state_.emplace(*dense, memory_->memory(), *sessions_, *checkpoints_);
  creates_.emplace(ChunkCreator::Lent{&options_, sessions_, dense, memory_.get(), lent_.hosted,
                                      lent_.checkpoint_key});
  pulls_.emplace(PullServer::Lent{ctx_, sessions_, dense, memory_->target(), options_.lease_timeout,
                                  [this] { RetryWaiting(); }},
                 *lent_.roster, options_.cluster);
  pushes_.emplace(PushApplier::Lent{&options_, sessions_, dense, memory_->target(),
                                    checkpoints_.get(), &membership_->steps(), &*pulls_});
  return Status::Ok();
}

void Shard::Begin() {
  pulls_->Begin();
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
      return true;
    default:
      return false;
  }
}

void Shard::OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  // The transport delimits messages, so a body this shard cannot accept
  // (malformed, or valid bytes that say something invalid) costs the
  // authenticated peer that request only: it gets the error, and the
  // connection stays usable.
  auto refused = [&](const Status& st) {
    sessions_->SendError(peer, h.request_id,
                         st.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
  };
  // The body decoded as Msg and handed to `serve`, or its error.
  auto decoded = [&]<typename Msg>(auto serve) {
    auto m = wire::DecodeBody<Msg>(h, frame);
    if (!m.ok()) return refused(m.status());
    serve(std::move(*m));
  };
  // The same, decoded into a message an earlier call of its kind handed
  // back (`spares`), so that its vectors keep their capacity.
  auto decoded_into_spare = [&]<typename Msg>(Spares<Msg>& spares, auto serve) {
    Msg m = spares.Take();
    Status st = wire::DecodeBodyInto(h, frame, &m);
    if (!st.ok()) {
      spares.Give(std::move(m));
      return refused(st);
    }
    serve(std::move(m));
  };
  switch (h.opcode) {
    case wire::Opcode::kCreate:
      return decoded.operator()<wire::Create>(
          [&](const wire::Create& m) { creates_->Serve(peer, h.request_id, m); });
    case wire::Opcode::kPush:
      return decoded_into_spare(pushes_->spares(), [&](wire::Push m) {
        if (pushes_->Serve(peer, h.request_id, h.flags, std::move(m))) RetryWaiting();
      });
    case wire::Opcode::kPull:
      return decoded_into_spare(pulls_->spares(),
                                [&](wire::Pull m) { OnPull(peer, h.request_id, std::move(m)); });
    case wire::Opcode::kSetHyper:
      return decoded.operator()<wire::SetHyper>(
          [&](const wire::SetHyper& m) { OnSetHyper(peer, h.request_id, m); });
    case wire::Opcode::kRelease:
      return decoded.operator()<wire::Release>([&](const wire::Release& m) {
        if (pulls_->Release(peer, m)) RetryWaiting();
      });
    case wire::Opcode::kGetState:
      return decoded.operator()<wire::GetState>(
          [&](const wire::GetState& m) { state_->Get(peer, h.request_id, m); });
    case wire::Opcode::kSetState:
      return decoded.operator()<wire::SetState>(
          [&](const wire::SetState& m) { state_->Set(peer, h.request_id, m); });
    case wire::Opcode::kSyncStep:
      return decoded.operator()<wire::SyncStep>([&](wire::SyncStep) {
        peer.ep->Send(wire::kProtocolMsg,
                      wire::Encode(wire::StepReply{tables_->SyncStepReached()}, h.request_id));
      });
    default:
      return sessions_->Drop(peer,
                             Status::Internal(std::string(wire::OpcodeName(h.opcode)) +
                                              " routed to the shard, which does not serve it"),
                             h.request_id);
  }
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
  if (pulls_) pulls_->Stop();
  if (pushes_) pushes_->Stop();
}

void Shard::JoinWriter() {
  if (checkpoints_) checkpoints_->JoinWriter();
}

void Shard::Release() {
  // The units that hold nothing but their counters stay: stats() may read
  // them after the server stopped.
  membership_.reset();
  checkpoints_.reset();
  tables_.reset();  // regions outlive their context safely (they hold the ucp context)
}

void Shard::OnPull(Peer& peer, uint64_t request_id, wire::Pull msg) {
  if (Status st = pulls_->CheckKeys(msg); !st.ok()) {
    pulls_->spares().Give(std::move(msg));
    return sessions_->SendError(peer, request_id, st);
  }
  if (pushes_->ResumeForPull(peer, msg)) RetryWaiting();  // what waits for that step
  pulls_->Serve(peer, request_id, std::move(msg));
}

void Shard::RetryWaiting() {
  pushes_->ApplyWaiting();
  pulls_->GrantWaiting();
}

void Shard::OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg) {
  if (peer.hello.task_index != 0) {
    return sessions_->SendError(peer, request_id,
                                Status::PermissionDenied(peer.hello.task + " is not the chief"));
  }
  for (uint32_t key : msg.key_ids) {
    if (tables_->dense().Find(key) == nullptr) {
      return sessions_->SendError(
          peer, request_id,
          Status::NotFound("set-hyper for unknown key id " + std::to_string(key)));
    }
  }
  for (uint32_t key : msg.key_ids) {
    Param* p = tables_->dense().Find(key);
    p->hyper = msg.hyper;
    TLOG_INFO("{}: learning rate {} from update {} on", p->display_name, msg.hyper.learning_rate,
              p->updates + 1);
  }
  peer.ep->Send(wire::kProtocolMsg, wire::Encode(wire::Ack{}, request_id));
}

}  // namespace tessera::server
