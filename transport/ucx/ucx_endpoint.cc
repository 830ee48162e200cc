#include "transport/ucx/ucx_endpoint.h"

#include <cstdio>
#include <cstdlib>

#include "core/log.h"
#include "core/pool_allocator.h"
#include "transport/closed.h"
#include "transport/region_desc.h"
#include "transport/run_on_loop.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_errors.h"
#include "transport/ucx/ucx_region.h"

namespace tessera::transport::ucx {
namespace {

// What a UCX request needs until its callback; one per operation, so from
// the pool.
struct SendRequest : Pooled {
  uint8_t header[2];
  MessageBytes bytes;
  Completion done;
};
struct RmaRequest : Pooled {
  Completion done;
  // Its completion is a sign of the peer's life (Endpoint::last_traffic).
  std::shared_ptr<UcxEndpoint> ep;
};

void NoteSuccess(SendRequest*, const Status&) {}
void NoteSuccess(RmaRequest* req, const Status& st) {
  if (st.ok() && req->ep) req->ep->NoteTraffic();
}

void CompleteSend(void* request, ucs_status_t status, void* user_data) {
  auto* req = static_cast<SendRequest*>(user_data);
  if (req->done) req->done(FromUcs(status, "send"));
  delete req;
  ucp_request_free(request);
}

void CompleteRma(void* request, ucs_status_t status, void* user_data) {
  auto* req = static_cast<RmaRequest*>(user_data);
  const Status st = FromUcs(status, "one-sided operation");
  NoteSuccess(req, st);
  if (req->done) req->done(st);
  delete req;
  ucp_request_free(request);
}

// Handles a UCX non-blocking call's return: completed now, failed, or pending.
template <typename Req>
void FinishImmediate(ucs_status_ptr_t sp, Req* req, const char* what) {
  if (sp == nullptr) {
    NoteSuccess(req, Status::Ok());
    if (req->done) req->done(Status::Ok());
    delete req;
  } else if (UCS_PTR_IS_ERR(sp)) {
    if (req->done) req->done(FromUcs(UCS_PTR_STATUS(sp), what));
    delete req;
  }
  // Otherwise the callback owns req.
}

}  // namespace

// ---------------------------------------------------------------------------
// UcxEndpoint

UcxEndpoint::~UcxEndpoint() = default;

Status UcxEndpoint::DeadStatus() const { return ClosedStatus(peer_, close_reason_); }

void UcxEndpoint::Send(uint16_t msg_id, MessageBytes bytes, Completion done) {
  RunOnProgress(*ctx_, this,
                [this, msg_id, bytes = std::move(bytes), done = std::move(done)]() mutable {
                  SendNow(msg_id, std::move(bytes), std::move(done));
                });
}

void UcxEndpoint::SendNow(uint16_t msg_id, MessageBytes bytes, Completion done) {
  if (ep_ == nullptr) {
    if (done) done(DeadStatus());
    return;
  }
  ctx_->counters_.messages_sent++;
  ctx_->counters_.message_bytes_sent += bytes.size();
  auto* req = new SendRequest{{},
                              {static_cast<uint8_t>(msg_id), static_cast<uint8_t>(msg_id >> 8)},
                              std::move(bytes),
                              std::move(done)};
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = &CompleteSend;
  param.user_data = req;
  ucs_status_ptr_t sp = ucp_am_send_nbx(ep_, kAmId, req->header, sizeof(req->header),
                                        req->bytes.data(), req->bytes.size(), &param);
  FinishImmediate(sp, req, "send");
}

Result<std::unique_ptr<RemoteRegion>> UcxEndpoint::Attach(std::span<const uint8_t> description) {
  auto desc = DecodeRegionDesc(description);
  if (!desc.ok()) return desc.status().WithContext("from " + peer_);
  if (desc->backend != BackendId::kUcx) {
    return Status::InvalidArgument("remote key from " + peer_ + " is not a UCX key");
  }
  return RunOnLoop(*ctx_, [&]() -> Result<std::unique_ptr<RemoteRegion>> {
    if (ep_ == nullptr) return DeadStatus();
    ucp_rkey_h rkey = nullptr;
    ucs_status_t st = ucp_ep_rkey_unpack(ep_, desc->key.data(), &rkey);
    if (st != UCS_OK) return FromUcs(st, "remote key from " + peer_ + " refused");
    return std::unique_ptr<RemoteRegion>(new UcxRemoteRegion(this, rkey, desc->base, desc->size));
  });
}

void UcxEndpoint::Put(const void* local, size_t len, const RemoteRegion& remote,
                      uint64_t remote_addr, Completion done) {
  Rma(Op::kPut, const_cast<void*>(local), len, remote, remote_addr, std::move(done));
}

void UcxEndpoint::Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
                      Completion done) {
  Rma(Op::kGet, local, len, remote, remote_addr, std::move(done));
}

void UcxEndpoint::Rma(Op op, void* local, size_t len, const RemoteRegion& remote,
                      uint64_t remote_addr, Completion done) {
  RunOnProgress(*ctx_, this,
                [this, op, local, len, &remote, remote_addr, done = std::move(done)]() mutable {
                  RmaNow(op, local, len, remote, remote_addr, std::move(done));
                });
}

namespace {
Status CheckRma(const UcxEndpoint* ep, const RemoteRegion& remote, uint64_t addr, size_t len,
                const std::string& peer) {
  const auto* r = dynamic_cast<const UcxRemoteRegion*>(&remote);
  if (r == nullptr || r->owner() != ep) {
    return Status::InvalidArgument("remote region was not attached to the endpoint of " + peer);
  }
  if (!remote.Contains(addr, len)) {
    return Status::OutOfRange("one-sided access of " + std::to_string(len) + " bytes at 0x" +
                              fmt::format("{:x}", addr) + " lies outside the region of " + peer);
  }
  return Status::Ok();
}
}  // namespace

void UcxEndpoint::RmaNow(Op op, void* local, size_t len, const RemoteRegion& remote,
                         uint64_t remote_addr, Completion done) {
  if (ep_ == nullptr) return done(DeadStatus());
  Status st = CheckRma(this, remote, remote_addr, len, peer_);
  if (!st.ok()) return done(st);
  auto& counters = ctx_->counters_;
  (op == Op::kPut ? counters.puts : counters.gets)++;
  (op == Op::kPut ? counters.put_bytes : counters.get_bytes) += len;
  auto* req = new RmaRequest{{}, std::move(done), shared_from_this()};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &CompleteRma;
  param.user_data = req;
  ucp_rkey_h rkey = static_cast<const UcxRemoteRegion&>(remote).rkey();
  ucs_status_ptr_t sp = op == Op::kPut ? ucp_put_nbx(ep_, local, len, remote_addr, rkey, &param)
                                       : ucp_get_nbx(ep_, local, len, remote_addr, rkey, &param);
  FinishImmediate(sp, req, op == Op::kPut ? "put" : "get");
}

void UcxEndpoint::Flush(Completion done) {
  RunOnProgress(*ctx_, this,
                [this, done = std::move(done)]() mutable { FlushNow(std::move(done)); });
}

void UcxEndpoint::FlushNow(Completion done) {
  if (ep_ == nullptr) return done(DeadStatus());
  auto* req = new RmaRequest{{}, std::move(done), shared_from_this()};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &CompleteRma;
  param.user_data = req;
  ucs_status_ptr_t sp = ucp_ep_flush_nbx(ep_, &param);
  FinishImmediate(sp, req, "flush");
}

std::string UcxEndpoint::DescribeLanes() {
  return RunOnLoop(*ctx_, [this]() -> std::string {
    if (ep_ == nullptr) return "closed";
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (f == nullptr) return "unknown";
    ucp_ep_print_info(ep_, f);
    fclose(f);
    std::string out(buf, len);
    free(buf);
    return out;
  });
}

void UcxEndpoint::CloseWith(bool force) {
  auto self = shared_from_this();
  auto close = [self, force] {
    if (self->ep_ == nullptr) return;
    self->ctx_->CloseEndpoint(self.get(), force);
  };
  if (ctx_->InProgressThread()) {
    close();
  } else {
    ctx_->Post(close);
  }
}

}  // namespace tessera::transport::ucx
