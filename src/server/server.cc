// A server process: one ps task's shard, the coordinator's service where
// this task hosts it, or both. Each connection is routed by the role its
// peer authenticated as: before that only the handshake is read; then a ps
// task's link goes to the coordinator's service, an observer gets status,
// and a worker's requests go to the service or to the shard by opcode.
#include "core/log.h"
#include "server/hosted_coordinator.h"
#include "server/shard.h"

namespace tessera::server {
namespace {

// What only a task holding tensors can answer.
bool HoldsTensors(wire::Opcode op) {
  switch (op) {
    case wire::Opcode::kCreate:
    case wire::Opcode::kPush:
    case wire::Opcode::kPull:
    case wire::Opcode::kRelease:
    case wire::Opcode::kSetHyper:
    case wire::Opcode::kGetState:
    case wire::Opcode::kSetState:
      return true;
    default:
      return false;
  }
}

// A worker as the coordinator knows it. A reader has no rank: its hello's
// is not its to claim (the coordinator reads none for it).
CoordinatorHost::Worker AsWorker(const Peer& peer) {
  return {.peer = reinterpret_cast<CoordinatorHost::PeerId>(peer.ep.get()),
          .task = peer.hello.task,
          .reader = peer.is_reader,
          .rank = peer.hello.task_index};
}

}  // namespace

void Shard::OnMessage(const EndpointPtr& ep, std::span<const uint8_t> frame) {
  if (link_ && link_->carries(ep.get())) return link_->OnFrame(frame);
  Peer* found = sessions_->Find(ep.get());
  if (found == nullptr) return;
  Peer& peer = *found;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) return sessions_->Drop(peer, h.status());
  if (!peer.authenticated) return sessions_->OnHandshakeFrame(peer, *h, frame);
  // Anyone authenticated may ping; a worker or ps task may say it leaves
  // on purpose (its disconnect is then no loss).
  if (h->opcode == wire::Opcode::kPing) return Reply(peer, h->request_id, wire::Ack{});
  if (h->opcode == wire::Opcode::kBye && !peer.is_observer) {
    peer.said_bye = true;
    return Reply(peer, h->request_id, wire::Ack{});
  }
  if (peer.is_shard) return OnShardPeerMessage(peer, *h, frame);
  if (peer.is_observer) return OnObserverMessage(peer, *h);
  if (peer.is_reader) {
    if (Status may = ReaderMay(peer, h->opcode); !may.ok()) {
      return sessions_->SendError(peer, h->request_id, may);
    }
  }
  OnWorkerMessage(peer, *h, frame);
}

Status Shard::ReaderMay(const Peer& peer, wire::Opcode op) {
  switch (op) {
    case wire::Opcode::kDeclare:  // looks tensors up, places none
    case wire::Opcode::kCreate:   // finds chunks, creates none
    case wire::Opcode::kPull:
    case wire::Opcode::kRelease:
    case wire::Opcode::kWaitInit:
    case wire::Opcode::kGetStep:
      return Status::Ok();
    default:
      return Status::PermissionDenied(std::string(wire::OpcodeName(op)) + " from reader " +
                                      peer.hello.task + ", a read-only client");
  }
}

void Shard::OnShardPeerMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  if (h.opcode == wire::Opcode::kAck) {
    if (h.request_id == kByeRequestId) OnByeAnswered(peer.ep.get());
    return;
  }
  const auto id = reinterpret_cast<CoordinatorHost::PeerId>(peer.ep.get());
  Status st = hosted_->OnLinkFrame(id, static_cast<int>(peer.hello.task_index), h, frame);
  if (!st.ok()) sessions_->Drop(peer, st.WithContext(peer.hello.task));
}

void Shard::OnObserverMessage(Peer& peer, const wire::Header& h) {
  if (h.opcode == wire::Opcode::kStatus) {
    return Reply(peer, h.request_id, wire::StatusReply{StatusJson()});
  }
  sessions_->SendError(
      peer, h.request_id,
      Status::PermissionDenied(std::string(wire::OpcodeName(h.opcode)) +
                               " from an observer, which may only ask for status"));
}

void Shard::OnWorkerMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  if (wire::AddressesCoordinator(h.opcode)) {
    if (!hosted_) {
      return sessions_->SendError(
          peer, h.request_id,
          Status::FailedPrecondition(std::string(wire::OpcodeName(h.opcode)) +
                                     " sent to a shard that is not the coordinator"));
    }
    return hosted_->OnWorkerRequest(AsWorker(peer), h, frame);
  }
  // The transport delimits messages, so a body this shard cannot accept
  // (malformed, or valid bytes that say something invalid) costs the
  // authenticated peer that request only: it gets the error, and the
  // connection stays usable. Unknown opcodes close it.
  // The body decoded as Msg and handed to `serve`, or its error.
  auto decoded = [&]<typename Msg>(auto serve) {
    auto m = wire::DecodeBody<Msg>(h, frame);
    if (!m.ok()) {
      return sessions_->SendError(
          peer, h.request_id,
          m.status().WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
    }
    serve(std::move(*m));
  };
  // The same, decoded into a message an earlier call of its kind handed
  // back (`spares`), so that its vectors keep their capacity.
  auto decoded_into_spare = [&]<typename Msg>(Spares<Msg>& spares, auto serve) {
    Msg m = spares.Take();
    Status st = wire::DecodeBodyInto(h, frame, &m);
    if (!st.ok()) {
      spares.Give(std::move(m));
      return sessions_->SendError(
          peer, h.request_id, st.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
    }
    serve(std::move(m));
  };
  if (HoldsTensors(h.opcode) && is_coordinator_only()) {
    return sessions_->SendError(
        peer, h.request_id,
        Status::FailedPrecondition(std::string(wire::OpcodeName(h.opcode)) +
                                   " sent to the coordinator, which holds no tensors"));
  }
  switch (h.opcode) {
    case wire::Opcode::kCreate:
      return decoded.operator()<wire::Create>(
          [&](const wire::Create& m) { OnCreate(peer, h.request_id, m); });
    case wire::Opcode::kPush:
      return decoded_into_spare(
          spare_pushes_, [&](wire::Push m) { OnPush(peer, h.request_id, h.flags, std::move(m)); });
    case wire::Opcode::kPull:
      return decoded_into_spare(spare_pulls_,
                                [&](wire::Pull m) { OnPull(peer, h.request_id, std::move(m)); });
    case wire::Opcode::kSetHyper:
      return decoded.operator()<wire::SetHyper>(
          [&](const wire::SetHyper& m) { OnSetHyper(peer, h.request_id, m); });
    case wire::Opcode::kRelease:
      return decoded.operator()<wire::Release>([&](const wire::Release& m) { OnRelease(peer, m); });
    case wire::Opcode::kGetState:
      return decoded.operator()<wire::GetState>(
          [&](const wire::GetState& m) { OnGetState(peer, h.request_id, m); });
    case wire::Opcode::kSetState:
      return decoded.operator()<wire::SetState>(
          [&](const wire::SetState& m) { OnSetState(peer, h.request_id, m); });
    case wire::Opcode::kSyncStep:
      return decoded.operator()<wire::SyncStep>(
          [&](wire::SyncStep) { Reply(peer, h.request_id, wire::StepReply{SyncStepReached()}); });
    default:
      // The shards count steps: a worker has no step to report.
      if (h.opcode == wire::Opcode::kStepsApplied) step_messages_from_workers_++;
      return sessions_->Drop(peer,
                             Status::InvalidArgument(std::string("unexpected ") +
                                                     wire::OpcodeName(h.opcode) + " from a worker"),
                             h.request_id);
  }
}

}  // namespace tessera::server

namespace tessera {

// The server composes its roles (server/role.h): the coordinator where
// this task hosts it, and the shard.
class Server::Impl {
 public:
  explicit Impl(const ServerOptions& options)
      : role(server::RoleOf(options)),
        coordinator(HostsCoordinator(role)
                        ? std::make_unique<server::HostedCoordinator>(options, role)
                        : nullptr),
        shard(options, coordinator.get()) {}
  const server::Role role;
  // Declared before the shard: the shard that reaches it goes first.
  std::unique_ptr<server::HostedCoordinator> coordinator;
  server::Shard shard;
};

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  TESSERA_RETURN_IF_ERROR(impl->shard.Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
uint16_t Server::port() const { return impl_->shard.port(); }
ServerStats Server::stats() const { return impl_->shard.stats(); }
void Server::Stop() { impl_->shard.Stop(); }
Status Server::WaitUntilWorkersLeave() {
  for (;;) {
    if (auto verdict = impl_->shard.WaitUntilWorkersLeaveFor(std::chrono::hours(1)))
      return *verdict;
  }
}
std::optional<Status> Server::WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit) {
  return impl_->shard.WaitUntilWorkersLeaveFor(limit);
}
bool Server::WaitForCoordinatorToStop(std::chrono::milliseconds limit) {
  return impl_->shard.WaitForCoordinatorToStop(limit);
}

}  // namespace tessera
