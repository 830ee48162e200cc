// rdma_cm: listening, connecting, and the connection events (requests,
// establishment, rejections, disconnects) of a VerbsContext. The hello
// each side sends in its private data says it is a Tessera peer and how
// many receive credits it grants.
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "transport/run_on_loop.h"
#include "transport/sockaddr.h"
#include "transport/verbs/verbs_context.h"
#include "transport/verbs/verbs_errors.h"

namespace tessera::transport::verbs {
namespace {

constexpr uint32_t kConnectMagic = 0x54455353;  // "TESS"
constexpr uint16_t kConnectVersion = 1;

ConnectPrivateData OurPrivateData(const Device& dev) {
  return ConnectPrivateData{kConnectMagic, kConnectVersion,
                            static_cast<uint16_t>(VerbsContext::kCredits), dev.node_guid};
}

// What rdma_connect and rdma_accept both send: our hello, and the RDMA
// READ depth. RNR retries stay at their maximum only as a backstop: credits
// keep receives posted.
rdma_conn_param ConnParam(const ConnectPrivateData* ours) {
  rdma_conn_param param{};
  param.private_data = ours;
  param.private_data_len = sizeof(*ours);
  param.responder_resources = 16;
  param.initiator_depth = 16;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  return param;
}

// The peer's private data, if it is a Tessera peer's.
bool ReadPrivateData(const rdma_conn_param& param, ConnectPrivateData* out) {
  if (param.private_data == nullptr || param.private_data_len < sizeof(ConnectPrivateData)) {
    return false;
  }
  std::memcpy(out, param.private_data, sizeof(*out));
  return out->magic == kConnectMagic && out->version == kConnectVersion && out->credits > 0;
}

}  // namespace

class VerbsListener final : public Listener {
 public:
  VerbsListener(VerbsContext* ctx, rdma_cm_id* id, uint16_t port)
      : ctx_(ctx), id_(id), port_(port) {}
  ~VerbsListener() override {
    RunOnLoop(*ctx_, [this] {
      ctx_->listeners_.erase(id_);
      rdma_destroy_id(id_);
      return 0;
    });
  }
  uint16_t port() const override { return port_; }

 private:
  VerbsContext* ctx_;
  rdma_cm_id* id_;
  uint16_t port_;
};

Result<std::unique_ptr<Listener>> VerbsContext::Listen(const std::string& host, uint16_t port,
                                                       AcceptHandler on_accept) {
  auto addr = Resolve(host.empty() ? "0.0.0.0" : host, port);
  if (!addr.ok()) return addr.status();
  return RunOnLoop(*this, [&]() -> Result<std::unique_ptr<Listener>> {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(cm_channel_, &id, nullptr, RDMA_PS_TCP) != 0) {
      return Status::Internal(std::string("rdma_create_id: ") + std::strerror(errno));
    }
    const std::string where = host + ":" + std::to_string(port);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*addr)) != 0) {
      const int err = errno;
      rdma_destroy_id(id);
      return Status::Unavailable(
          "listen on " + where + ": rdma_bind_addr: " + std::strerror(err) +
          (err == EADDRNOTAVAIL || err == ENODEV ? " (no RDMA device carries this address)" : ""));
    }
    if (Device* dev = id->verbs ? DeviceOf(id->verbs) : nullptr;
        dev != nullptr && !options_.device.empty() && dev->name != options_.device) {
      rdma_destroy_id(id);
      return Status::FailedPrecondition("listen on " + where + ": that address is on " + dev->name +
                                        ", not the requested " + options_.device);
    }
    if (rdma_listen(id, 128) != 0) {
      const int err = errno;
      rdma_destroy_id(id);
      return Status::Unavailable("listen on " + where + ": rdma_listen: " + std::strerror(err));
    }
    listeners_[id] = std::move(on_accept);
    return std::unique_ptr<Listener>(new VerbsListener(this, id, ntohs(rdma_get_src_port(id))));
  });
}

void VerbsContext::Connect(const std::string& host, uint16_t port,
                           std::chrono::milliseconds timeout, ConnectCallback done) {
  const std::string peer = host + ":" + std::to_string(port);
  Post([this, host, port, timeout, peer, done = std::move(done)]() mutable {
    auto addr = Resolve(host, port);
    if (!addr.ok()) return done(addr.status());
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(cm_channel_, &id, nullptr, RDMA_PS_TCP) != 0) {
      return done(Status::Internal(std::string("rdma_create_id: ") + std::strerror(errno)));
    }
    auto ep = std::make_shared<VerbsEndpoint>(this, peer, options_);
    ep->id_ = id;
    ep->connect_done_ = std::move(done);
    by_id_[id] = ep;
    const int ms = static_cast<int>(std::max<int64_t>(1, timeout.count()));
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&*addr), ms) != 0) {
      ep->MarkDead(Status::Unavailable("connect to " + peer +
                                       ": rdma_resolve_addr: " + std::strerror(errno)),
                   /*report=*/true);
      return;
    }
    std::weak_ptr<VerbsEndpoint> weak = ep;
    PostAfter(timeout, [weak, peer, timeout] {
      auto pending = weak.lock();
      if (!pending || pending->announced_ || pending->dead_) return;
      pending->MarkDead(Status::DeadlineExceeded("connect to " + peer + ": no answer within " +
                                                 std::to_string(timeout.count()) + " ms"),
                        /*report=*/true);
    });
  });
}

bool VerbsContext::PollCmEvents() {
  bool worked = false;
  rdma_cm_event* event = nullptr;
  while (rdma_get_cm_event(cm_channel_, &event) == 0) {
    worked = true;
    OnCmEvent(event);
  }
  return worked;
}

void VerbsContext::OnCmEvent(rdma_cm_event* event) {
  if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) return OnConnectRequest(event);
  rdma_cm_id* id = event->id;
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    rdma_ack_cm_event(event);
    return;
  }
  std::shared_ptr<VerbsEndpoint> ep = it->second;
  const rdma_cm_event_type type = event->event;
  const int status = event->status;
  ConnectPrivateData theirs{};
  const bool tessera_peer = ReadPrivateData(event->param.conn, &theirs);
  rdma_ack_cm_event(event);  // before anything below may destroy the id

  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(id, 2000) != 0) {
        ep->MarkDead(Status::Unavailable("connect to " + ep->peer_ +
                                         ": rdma_resolve_route: " + std::strerror(errno)),
                     true);
      }
      return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      Status st = SetUpQp(*ep, id);
      if (!st.ok()) return ep->MarkDead(st.WithContext("connect to " + ep->peer_), true);
      const ConnectPrivateData ours = OurPrivateData(*ep->dev_);
      rdma_conn_param param = ConnParam(&ours);
      if (rdma_connect(id, &param) != 0) {
        ep->MarkDead(Status::Unavailable("connect to " + ep->peer_ +
                                         ": rdma_connect: " + std::strerror(errno)),
                     true);
      }
      return;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
      if (!ep->passive_) {
        if (!tessera_peer) {
          return ep->MarkDead(Status::Unavailable("connect to " + ep->peer_ +
                                                  ": the peer is not a Tessera verbs endpoint"),
                              true);
        }
        ep->send_credits_ = theirs.credits;
        ep->remote_guid_ = theirs.node_guid;
      }
      ep->alive_ = true;
      if (!ep->announced_) {
        ep->announced_ = true;
        if (ep->passive_) {
          if (ep->on_accept_) ep->on_accept_(ep);
        } else if (ep->connect_done_) {
          auto cb = std::move(ep->connect_done_);
          ep->connect_done_ = nullptr;
          cb(std::shared_ptr<Endpoint>(ep));
        }
      }
      ep->Pump();
      return;
    case RDMA_CM_EVENT_REJECTED:
      return ep->MarkDead(
          Status::Unavailable("connect to " + ep->peer_ +
                              ": refused (no Tessera listener there, or it turned us away; "
                              "rdma_cm status " +
                              std::to_string(status) + ")"),
          true);
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return ep->MarkDead(
          Status::Unavailable("connect to " + ep->peer_ + ": " + rdma_event_str(type) + " (" +
                              std::strerror(status < 0 ? -status : status) + ")"),
          true);
    case RDMA_CM_EVENT_DISCONNECTED:
      return ep->MarkDead(Status::Unavailable("connection to " + ep->peer_ + " closed by the peer"),
                          true);
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return ep->MarkDead(
          Status::Unavailable("connection to " + ep->peer_ + ": the RDMA device was removed"),
          true);
    default:
      return;  // TIMEWAIT_EXIT, ADDR_CHANGE, ...
  }
}

void VerbsContext::OnConnectRequest(rdma_cm_event* event) {
  rdma_cm_id* id = event->id;
  auto listener = listeners_.find(event->listen_id);
  ConnectPrivateData theirs{};
  const bool tessera_peer = ReadPrivateData(event->param.conn, &theirs);
  rdma_ack_cm_event(event);
  sockaddr_storage from{};
  std::memcpy(&from, rdma_get_peer_addr(id), sizeof(sockaddr_in6));
  const std::string peer = SockaddrToString(from);
  if (listener == listeners_.end() || !tessera_peer) {
    TLOG_WARN("{}: connection from {} refused: {}", options_.name, peer,
              tessera_peer ? "no listener" : "not a Tessera verbs peer");
    rdma_reject(id, nullptr, 0);
    rdma_destroy_id(id);
    return;
  }
  auto ep = std::make_shared<VerbsEndpoint>(this, peer, options_);
  ep->id_ = id;
  ep->passive_ = true;
  ep->on_accept_ = listener->second;
  ep->send_credits_ = theirs.credits;
  ep->remote_guid_ = theirs.node_guid;
  by_id_[id] = ep;
  Status st = SetUpQp(*ep, id);
  if (!st.ok()) {
    TLOG_WARN("{}: connection from {} refused: {}", options_.name, peer, st.ToString());
    rdma_reject(id, nullptr, 0);
    by_id_.erase(id);
    if (ep->qp_) {
      by_qp_.erase(ep->qp_->qp_num);
      rdma_destroy_qp(id);
    }
    rdma_destroy_id(id);
    return;
  }
  const ConnectPrivateData ours = OurPrivateData(*ep->dev_);
  rdma_conn_param param = ConnParam(&ours);
  if (rdma_accept(id, &param) != 0) {
    ep->MarkDead(Status::Unavailable("accepting " + peer + ": " + std::strerror(errno)), false);
  }
}

}  // namespace tessera::transport::verbs
