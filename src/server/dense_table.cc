#include "server/dense_table.h"

#include "core/log.h"

namespace tessera::server {

DenseTable::DenseTable(Lent lent)
    : lent_(std::move(lent)),
      chunks_(lent_.ctx, &lent_.memory->memory(), lent_.memory->arena_kind(),
              lent_.options->arena_bytes, lent_.options->cluster.num_workers()),
      cut_(chunks_, lent_.memory->memory(), TaskId{"ps", lent_.options->task_index}.ToString(),
           DenseCut::Events{
               .captured = [this] { lent_.checkpoints->TableCaptured(); },
               .failed = [this](const Status& why) { lent_.checkpoints->TableFailed(why); }}),
      state_(chunks_, lent_.memory->memory(), *lent_.sessions, *lent_.checkpoints),
      creates_(ChunkCreator::Lent{lent_.options, lent_.sessions, &chunks_, lent_.memory,
                                  lent_.hosted, lent_.checkpoint_key}),
      pulls_(PullServer::Lent{lent_.ctx, lent_.sessions, &chunks_, lent_.memory->target(),
                              lent_.options->lease_timeout, [this] { RetryWaiting(); }},
             *lent_.roster, lent_.options->cluster),
      pushes_(PushApplier::Lent{lent_.options, lent_.sessions, &chunks_, lent_.memory->target(),
                                lent_.checkpoints, &cut_, lent_.steps, &pulls_}) {}

std::vector<wire::Opcode> DenseTable::Opcodes() const {
  using wire::Opcode;
  return {Opcode::kCreate,   Opcode::kPush,     Opcode::kPull,    Opcode::kRelease,
          Opcode::kSetHyper, Opcode::kGetState, Opcode::kSetState};
}

template <typename Msg, typename Serve>
void DenseTable::DecodedIntoSpare(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame,
                                  Spares<Msg>& spares, Serve serve) {
  Msg m = spares.Take();
  if (Status st = wire::DecodeBodyInto(h, frame, &m); !st.ok()) {
    spares.Give(std::move(m));
    return Refuse(peer, h, st);
  }
  serve(std::move(m));
}

void DenseTable::Refuse(Peer& peer, const wire::Header& h, const Status& why) {
  lent_.sessions->SendError(peer, h.request_id,
                            why.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
}

void DenseTable::OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  // The transport delimits messages, so a body this table cannot accept
  // (malformed, or valid bytes that say something invalid) costs the
  // authenticated peer that request only: it gets the error, and the
  // connection stays usable.
  auto decoded = [&]<typename Msg>(auto serve) {
    auto m = wire::DecodeBody<Msg>(h, frame);
    if (!m.ok()) return Refuse(peer, h, m.status());
    serve(std::move(*m));
  };
  switch (h.opcode) {
    case wire::Opcode::kCreate:
      return decoded.operator()<wire::Create>(
          [&](const wire::Create& m) { creates_.Serve(peer, h.request_id, m); });
    case wire::Opcode::kPush:
      return DecodedIntoSpare(peer, h, frame, pushes_.spares(), [&](wire::Push m) {
        if (pushes_.Serve(peer, h.request_id, h.flags, std::move(m))) RetryWaiting();
      });
    case wire::Opcode::kPull:
      return DecodedIntoSpare(peer, h, frame, pulls_.spares(),
                              [&](wire::Pull m) { OnPull(peer, h.request_id, std::move(m)); });
    case wire::Opcode::kSetHyper:
      return decoded.operator()<wire::SetHyper>(
          [&](const wire::SetHyper& m) { OnSetHyper(peer, h.request_id, m); });
    case wire::Opcode::kRelease:
      return decoded.operator()<wire::Release>([&](const wire::Release& m) {
        if (pulls_.Release(peer, m)) RetryWaiting();
      });
    case wire::Opcode::kGetState:
      return decoded.operator()<wire::GetState>(
          [&](const wire::GetState& m) { state_.Get(peer, h.request_id, m); });
    case wire::Opcode::kSetState:
      return decoded.operator()<wire::SetState>(
          [&](const wire::SetState& m) { state_.Set(peer, h.request_id, m); });
    default:
      return lent_.sessions->Drop(peer,
                                  Status::Internal(std::string(wire::OpcodeName(h.opcode)) +
                                                   " handed to the dense table, which does not "
                                                   "serve it"),
                                  h.request_id);
  }
}

void DenseTable::OnPull(Peer& peer, uint64_t request_id, wire::Pull msg) {
  if (Status st = pulls_.CheckKeys(msg); !st.ok()) {
    pulls_.spares().Give(std::move(msg));
    return lent_.sessions->SendError(peer, request_id, st);
  }
  if (pushes_.ResumeForPull(peer, msg)) RetryWaiting();  // what waits for that step
  pulls_.Serve(peer, request_id, std::move(msg));
}

void DenseTable::OnSetHyper(Peer& peer, uint64_t request_id, const wire::SetHyper& msg) {
  if (peer.hello.task_index != 0) {
    return lent_.sessions->SendError(
        peer, request_id, Status::PermissionDenied(peer.hello.task + " is not the chief"));
  }
  for (uint32_t key : msg.key_ids) {
    if (chunks_.Find(key) == nullptr) {
      return lent_.sessions->SendError(
          peer, request_id,
          Status::NotFound("set-hyper for unknown key id " + std::to_string(key)));
    }
  }
  for (uint32_t key : msg.key_ids) {
    Param* p = chunks_.Find(key);
    p->hyper = msg.hyper;
    TLOG_INFO("{}: learning rate {} from update {} on", p->display_name, msg.hyper.learning_rate,
              p->updates + 1);
  }
  peer.ep->Send(wire::kProtocolMsg, wire::Encode(wire::Ack{}, request_id));
}

void DenseTable::RetryWaiting() {
  pushes_.ApplyWaiting();
  pulls_.GrantWaiting();
}

void DenseTable::OnPeerGone(const Peer& peer) {
  pulls_.PeerGone(peer);
  pushes_.PeerGone(peer);
}

void DenseTable::Stop() {
  cut_.Drop();
  pulls_.Stop();
  pushes_.Stop();
}

void DenseTable::AddStats(ServerStats* stats) const {
  creates_.AddStats(stats);
  pushes_.AddStats(stats);
  pulls_.AddStats(stats);
}

void DenseTable::AddToJoin(std::vector<wire::Join>* joins) const {
  chunks_.ForEach([&](const Param& p) {
    if (joins->back().chunks.size() == wire::Join::kMaxChunks) {
      joins->emplace_back();
      joins->back().more = true;
    }
    wire::CreateEntry e = p.entry;
    e.tensor.hyper = p.hyper;  // as set at run time
    joins->back().chunks.push_back(std::move(e));
    joins->back().initialized.push_back(p.initialized ? 1 : 0);
  });
}

}  // namespace tessera::server
