#include "server/coordinator_link.h"

#include "core/log.h"

namespace tessera::server {

using namespace std::chrono_literals;
using wire::kProtocolMsg;

void CoordinatorLink::Connect() {
  if (stopping_ || link_) return;
  const TaskId coord_task = options_.cluster.coordinator();
  const TaskAddress addr = options_.cluster.address(coord_task).value();
  ctx_.Connect(addr.host, addr.port, 2000ms,
               [this, coord_task, addr](Result<std::shared_ptr<transport::Endpoint>> ep) {
                 if (stopping_) {
                   if (ep.ok()) (*ep)->Close();
                   return;
                 }
                 if (ep.ok()) return OnConnected(*ep);
                 const auto now = std::chrono::steady_clock::now();
                 if (now >= next_wait_report_) {
                   TLOG_INFO("waiting for the coordinator {} at {}: {}", coord_task.ToString(),
                             addr.ToString(), ep.status().message());
                   next_wait_report_ = now + 10s;
                 }
                 ctx_.PostAfter(300ms, [this] { Connect(); });
               });
}

void CoordinatorLink::OnConnected(std::shared_ptr<transport::Endpoint> ep) {
  link_ = std::move(ep);
  wire::Hello hello;
  hello.role = wire::PeerRole::kShard;
  hello.task_index = static_cast<uint32_t>(options_.task_index);
  hello.task = TaskId{"ps", options_.task_index}.ToString();
  hello.cluster = options_.cluster.ToJson();
  hello.protection = options_.protection;
  handshake_.emplace(options_.secret, std::move(hello));
  link_->Send(kProtocolMsg, wire::Encode(handshake_->hello(), 1));
  std::weak_ptr<transport::Endpoint> sent_on = link_;
  const auto limit = options_.hello_deadline;
  ctx_.PostAfter(limit, [this, sent_on, limit] {
    if (stopping_ || !handshake_ || link_ != sent_on.lock()) return;
    TLOG_WARN(
        "the coordinator took the connection but did not finish the handshake within {} ms; "
        "joining again",
        limit.count());
    handshake_.reset();
    auto link = std::move(link_);
    link->Abort();
    Connect();
  });
}

void CoordinatorLink::OnFrame(std::span<const uint8_t> frame) {
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) {
    auto link = link_;
    OnClosed(h.status().WithContext("bad message from the coordinator"));
    link->Close();
    return;
  }
  switch (h->opcode) {
    case wire::Opcode::kChallenge:
    case wire::Opcode::kWelcome:
      return OnHandshake(frame);
    case wire::Opcode::kJoinReply: {
      auto m = wire::DecodeBody<wire::JoinReply>(*h, frame);
      if (!m.ok()) return;
      joined_ = true;
      return events_.joined(*m);
    }
    case wire::Opcode::kCkptPrepare:
    case wire::Opcode::kCkptWrite:
    case wire::Opcode::kCkptAbort:
      return events_.checkpoint(frame);
    case wire::Opcode::kBye:
      said_bye_ = true;
      link_->Send(kProtocolMsg, wire::Encode(wire::Ack{}, h->request_id));
      return events_.coordinator_stops();
    case wire::Opcode::kAck:
      return events_.acked(h->request_id);
    case wire::Opcode::kError: {
      auto err = wire::DecodeBody<wire::Error>(*h, frame);
      Status st = err.ok() ? Status(err->code, err->message) : err.status();
      if (handshake_) return Refuse(st);  // it refused this task
      TLOG_ERROR("the coordinator: {}", st.message());
      return;
    }
    default:
      return;
  }
}

void CoordinatorLink::OnHandshake(std::span<const uint8_t> frame) {
  if (!handshake_) return Refuse(Status::Internal("handshake out of turn"));
  const uint32_t expect = options_.cluster.separate_coordinator() ? wire::kCoordinatorIndex : 0u;
  auto next = handshake_->OnFrame(frame, expect, "the coordinator");
  if (!next.ok()) return Refuse(next.status());
  if (const auto* auth = std::get_if<wire::Auth>(&*next)) {
    link_->Send(kProtocolMsg, wire::Encode(*auth, 2));
    return;
  }
  if (std::get<wire::Welcome>(*next).session_protected()) {
    // Before anything else is sent: the coordinator seals all after its welcome.
    if (Status sealed = link_->ProtectSession(handshake_->Keys()); !sealed.ok()) {
      return Refuse(sealed);
    }
  }
  handshake_.reset();
  link_->MarkAuthenticated();
  for (auto& frame_out : events_.join()) link_->Send(kProtocolMsg, std::move(frame_out));
}

void CoordinatorLink::Refuse(const Status& why) {
  TLOG_ERROR("could not join the coordinator: {}; trying again in 5 s", why.message());
  handshake_.reset();
  joined_ = false;
  auto link = std::move(link_);
  if (link) link->Close();
  if (!stopping_) ctx_.PostAfter(5s, [this] { Connect(); });
}

void CoordinatorLink::OnClosed(const Status& why) {
  if (!link_) return;
  link_.reset();
  joined_ = false;
  events_.closed();
  if (stopping_) return;
  if (said_bye_) {
    TLOG_INFO("the coordinator stopped; joining it again when it is back");
  } else {
    TLOG_WARN("lost the coordinator: {}; rejoining", why.message());
  }
  said_bye_ = false;
  ctx_.PostAfter(1s, [this] { Connect(); });
}

void CoordinatorLink::Send(MessageBytes frame) {
  if (link_) link_->Send(kProtocolMsg, std::move(frame));
}

void CoordinatorLink::Stop() {
  stopping_ = true;
  if (link_) link_->Close();
}

}  // namespace tessera::server
