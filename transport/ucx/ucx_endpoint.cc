#include "transport/ucx/ucx_endpoint.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "core/mapped_range.h"
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
  // Set only while the operation is pending: its completion then came from
  // the peer, a sign of its life (Endpoint::last_traffic). One that
  // completed at once (a copy into the peer's mapped memory, data buffered
  // here) says nothing about the peer, and taking the reference and reading
  // the clock for it cost more than a 4 KiB put over shared memory.
  std::shared_ptr<UcxEndpoint> ep;
};

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

// Handles a UCX non-blocking call's return: completed now, failed, or
// pending. True when pending: the callback owns req then.
template <typename Req>
bool FinishImmediate(ucs_status_ptr_t sp, Req* req, const char* what) {
  if (sp != nullptr && !UCS_PTR_IS_ERR(sp)) return true;
  if (req->done) req->done(sp == nullptr ? Status::Ok() : FromUcs(UCS_PTR_STATUS(sp), what));
  delete req;
  return false;
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
    // Mapped here (UCX over shared memory): puts and gets into it are copies
    // this process can make itself. Only where UCX reaches host memory alone,
    // so that the local side of every put and get is host memory too (GPU
    // buffers are staged through host memory then, never handed to it).
    void* mapped = nullptr;
    if ((ctx_->memory_types_ & ~UCS_BIT(UCS_MEMORY_TYPE_HOST)) != 0 ||
        ucp_rkey_ptr(rkey, desc->base, &mapped) != UCS_OK) {
      mapped = nullptr;
    }
    // The size is the peer's word, and UCX checks no bounds on memory it
    // maps: a region larger than what UCX mapped would have this process
    // (or UCX's own copy) read and write past the mapping. Checked once,
    // here; the copies then check each piece against the size.
    const RangeMapping mapping =
        mapped == nullptr ? RangeMapping::kReadWrite : MappingOf(mapped, desc->size);
    if (mapping == RangeMapping::kNotWhole) {
      ucp_rkey_destroy(rkey);
      return Status::InvalidArgument("remote key from " + peer_ + " describes " +
                                     std::to_string(desc->size) +
                                     " bytes, more than UCX mapped of that memory here");
    }
    if (mapping == RangeMapping::kReadOnly) mapped = nullptr;  // UCX's own puts and gets then
    return std::unique_ptr<RemoteRegion>(
        new UcxRemoteRegion(this, rkey, desc->base, desc->size, static_cast<uint8_t*>(mapped)));
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
const UcxRemoteRegion* AttachedTo(const UcxEndpoint* ep, const RemoteRegion& remote) {
  const auto* r = dynamic_cast<const UcxRemoteRegion*>(&remote);
  return r != nullptr && r->owner() == ep ? r : nullptr;
}

Status NotAttached(const std::string& peer) {
  return Status::InvalidArgument("remote region was not attached to the endpoint of " + peer);
}

Status Outside(uint64_t addr, size_t len, const std::string& peer) {
  return Status::OutOfRange("one-sided access of " + std::to_string(len) + " bytes at 0x" +
                            fmt::format("{:x}", addr) + " lies outside the region of " + peer);
}
}  // namespace

void UcxEndpoint::CopyMapped(Op op, std::span<const RmaPiece> pieces, const UcxRemoteRegion& r,
                             const Completion& done) {
  uint64_t bytes = 0;
  for (const RmaPiece& piece : pieces) {
    if (!r.Contains(piece.remote_addr, piece.len)) {
      return done(Outside(piece.remote_addr, piece.len, peer_));
    }
    bytes += piece.len;
  }
  // Nothing between two copies: see Endpoint::PutMany.
  for (const RmaPiece& piece : pieces) {
    uint8_t* there = r.MappedAt(piece.remote_addr);
    if (op == Op::kPut) {
      std::memcpy(there, piece.local, piece.len);
    } else {
      std::memcpy(piece.local, there, piece.len);
    }
  }
  auto& counters = ctx_->counters_;
  (op == Op::kPut ? counters.puts : counters.gets) += pieces.size();
  (op == Op::kPut ? counters.put_bytes : counters.get_bytes) += bytes;
  done(Status::Ok());
}

void UcxEndpoint::RmaNow(Op op, void* local, size_t len, const RemoteRegion& remote,
                         uint64_t remote_addr, Completion done) {
  if (ep_ == nullptr) return done(DeadStatus());
  const UcxRemoteRegion* r = AttachedTo(this, remote);
  if (r == nullptr) return done(NotAttached(peer_));
  if (r->mapped() != nullptr) {
    const RmaPiece piece{local, len, remote_addr};
    return CopyMapped(op, {&piece, 1}, *r, done);
  }
  if (!remote.Contains(remote_addr, len)) return done(Outside(remote_addr, len, peer_));
  auto& counters = ctx_->counters_;
  (op == Op::kPut ? counters.puts : counters.gets)++;
  (op == Op::kPut ? counters.put_bytes : counters.get_bytes) += len;
  auto* req = new RmaRequest{{}, std::move(done), nullptr};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &CompleteRma;
  param.user_data = req;
  ucs_status_ptr_t sp = op == Op::kPut
                            ? ucp_put_nbx(ep_, local, len, remote_addr, r->rkey(), &param)
                            : ucp_get_nbx(ep_, local, len, remote_addr, r->rkey(), &param);
  // The callback runs from this thread's next worker progress, not before.
  if (FinishImmediate(sp, req, op == Op::kPut ? "put" : "get")) req->ep = shared_from_this();
}

void UcxEndpoint::PutMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                          Completion done) {
  RmaMany(Op::kPut, pieces, remote, std::move(done));
}

void UcxEndpoint::GetMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                          Completion done) {
  RmaMany(Op::kGet, pieces, remote, std::move(done));
}

void UcxEndpoint::RmaMany(Op op, std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                          Completion done) {
  // Off the progress thread the pieces are issued one by one, each posted
  // there (the span is not ours to keep).
  if (ctx_->InProgressThread() && ep_ != nullptr) {
    const UcxRemoteRegion* r = AttachedTo(this, remote);
    if (r != nullptr && r->mapped() != nullptr) return CopyMapped(op, pieces, *r, done);
  }
  if (op == Op::kPut) return Endpoint::PutMany(pieces, remote, std::move(done));
  Endpoint::GetMany(pieces, remote, std::move(done));
}

void UcxEndpoint::Flush(Completion done) {
  RunOnProgress(*ctx_, this,
                [this, done = std::move(done)]() mutable { FlushNow(std::move(done)); });
}

void UcxEndpoint::FlushNow(Completion done) {
  if (ep_ == nullptr) return done(DeadStatus());
  auto* req = new RmaRequest{{}, std::move(done), nullptr};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &CompleteRma;
  param.user_data = req;
  ucs_status_ptr_t sp = ucp_ep_flush_nbx(ep_, &param);
  if (FinishImmediate(sp, req, "flush")) req->ep = shared_from_this();
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
