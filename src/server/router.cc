#include "server/router.h"

#include "core/log.h"

namespace tessera::server {
namespace {

// A worker as the coordinator knows it. A reader has no rank: its hello's
// is not its to claim (the coordinator reads none for it).
CoordinatorHost::Worker AsWorker(const Peer& peer) {
  return {.peer = reinterpret_cast<CoordinatorHost::PeerId>(peer.ep.get()),
          .task = peer.hello.task,
          .reader = peer.is_reader,
          .rank = peer.hello.task_index};
}

}  // namespace

void Router::OnMessage(const EndpointPtr& ep, std::span<const uint8_t> frame) {
  if (parts_.shard != nullptr && parts_.shard->OnLinkFrame(ep.get(), frame)) return;
  Peer* found = parts_.sessions->Find(ep.get());
  if (found == nullptr) return;
  Peer& peer = *found;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) return parts_.sessions->Drop(peer, h.status());
  if (!peer.authenticated) return parts_.sessions->OnHandshakeFrame(peer, *h, frame);
  // Anyone authenticated may ping; a worker or ps task may say it leaves
  // on purpose (its disconnect is then no loss).
  if (h->opcode == wire::Opcode::kPing) return Reply(peer, h->request_id, wire::Ack{});
  if (h->opcode == wire::Opcode::kBye && !peer.is_observer) {
    peer.said_bye = true;
    return Reply(peer, h->request_id, wire::Ack{});
  }
  if (peer.is_shard) return OnPsLinkMessage(peer, *h, frame);
  if (peer.is_observer) return OnObserverMessage(peer, *h);
  if (peer.is_reader) {
    if (Status may = ReaderMay(peer, h->opcode); !may.ok()) {
      return parts_.sessions->SendError(peer, h->request_id, may);
    }
  }
  OnWorkerMessage(peer, *h, frame);
}

Status Router::ReaderMay(const Peer& peer, wire::Opcode op) {
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

void Router::OnPsLinkMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  if (h.opcode == wire::Opcode::kAck) {
    if (h.request_id == ByeRound::kRequestId) parts_.bye->Answered(peer.ep.get());
    return;
  }
  // Only a coordinator admits ps tasks' links (PeerSessions).
  const auto id = reinterpret_cast<CoordinatorHost::PeerId>(peer.ep.get());
  Status st =
      parts_.coordinator->OnLinkFrame(id, static_cast<int>(peer.hello.task_index), h, frame);
  if (!st.ok()) parts_.sessions->Drop(peer, st.WithContext(peer.hello.task));
}

void Router::OnObserverMessage(Peer& peer, const wire::Header& h) {
  if (h.opcode == wire::Opcode::kStatus) {
    return Reply(peer, h.request_id, wire::StatusReply{parts_.status_json()});
  }
  parts_.sessions->SendError(
      peer, h.request_id,
      Status::PermissionDenied(std::string(wire::OpcodeName(h.opcode)) +
                               " from an observer, which may only ask for status"));
}

void Router::OnWorkerMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  // Named only in an error: no string is built per request.
  auto op = [&h] { return std::string(wire::OpcodeName(h.opcode)); };
  if (wire::AddressesCoordinator(h.opcode)) {
    if (parts_.coordinator == nullptr) {
      return parts_.sessions->SendError(
          peer, h.request_id,
          Status::FailedPrecondition(op() + " sent to a shard that is not the coordinator"));
    }
    return parts_.coordinator->OnWorkerRequest(AsWorker(peer), h, frame);
  }
  if (Shard::Serves(h.opcode)) {
    if (parts_.shard == nullptr) {
      return parts_.sessions->SendError(
          peer, h.request_id,
          Status::FailedPrecondition(op() + " sent to the coordinator, which holds no tensors"));
    }
    return parts_.shard->OnRequest(peer, h, frame);
  }
  // The shards count steps: a worker has no step to report.
  if (h.opcode == wire::Opcode::kStepsApplied) {
    step_messages_from_workers_.fetch_add(1, std::memory_order_relaxed);
  }
  parts_.sessions->Drop(peer, Status::InvalidArgument("unexpected " + op() + " from a worker"),
                        h.request_id);
}

Status Router::OnWorkerJoins(Peer& peer, wire::Welcome* welcome) {
  if (parts_.shard != nullptr) {
    TESSERA_RETURN_IF_ERROR(parts_.shard->OnWorkerJoins(peer, welcome));
  }
  parts_.roster->Joined(peer.hello.task_index);
  if (parts_.leaving != nullptr) parts_.leaving->Connected(peer.hello.task_index, peer.hello.task);
  return Status::Ok();
}

void Router::OnDisconnect(const EndpointPtr& ep, const Status& why) {
  parts_.bye->Answered(ep.get());
  if (parts_.shard != nullptr && parts_.shard->OnLinkClosed(ep.get(), why)) return;
  Peer* peer = parts_.sessions->Find(ep.get());
  if (peer == nullptr) return parts_.sessions->Forget(ep);  // one refused, told why
  bool rank_departed = false;
  if (peer->is_shard) {
    if (peer->said_bye) {
      TLOG_INFO("{} stopped", peer->hello.task);
    } else {
      TLOG_WARN("{} left the coordinator: {}", peer->hello.task, why.message());
    }
  } else if (peer->is_reader) {
    TLOG_INFO("reader {} {}", peer->hello.task,
              peer->said_bye ? "left" : "disconnected: " + why.message());
  } else if (peer->authenticated && !peer->is_observer) {
    rank_departed = OnWorkerLeft(*peer, why);
  }
  if (parts_.shard != nullptr) parts_.shard->OnPeerGone(*peer, rank_departed);
  if (parts_.coordinator != nullptr) {
    parts_.coordinator->OnPeerGone(reinterpret_cast<CoordinatorHost::PeerId>(ep.get()));
  }
  parts_.sessions->Forget(ep);
}

bool Router::OnWorkerLeft(const Peer& peer, const Status& why) {
  if (peer.said_bye) {
    TLOG_INFO("{} left", peer.hello.task);
  } else {
    TLOG_INFO("{} disconnected: {}", peer.hello.task, why.message());
  }
  const uint32_t rank = peer.hello.task_index;
  const bool departed =
      parts_.roster->Left(rank, peer.hello.task, std::chrono::steady_clock::now());
  if (parts_.leaving != nullptr) parts_.leaving->Left(rank, peer.said_bye);
  return departed;
}

}  // namespace tessera::server
