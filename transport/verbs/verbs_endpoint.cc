// A verbs connection: fragments and credits for messages, WRITE and READ for
// one-sided data, one queue of pending work so that everything is posted in
// the order it was issued.
#include <cstring>

#include "core/log.h"
#include "gpu/cuda.h"
#include "transport/closed.h"
#include "transport/run_on_loop.h"
#include "transport/verbs/verbs_context.h"
#include "transport/verbs/verbs_errors.h"

namespace tessera::transport::verbs {
namespace {

constexpr uint8_t kFirst = 1, kLast = 2, kCreditOnly = 4;
constexpr uint32_t kFragmentPayload = VerbsContext::kSlotBytes - sizeof(FragmentHeader);

}  // namespace

Status VerbsEndpoint::DeadStatus() const { return ClosedStatus(peer_, close_reason_); }

// ---------------------------------------------------------------------------
// Issuing

void VerbsEndpoint::Send(uint16_t msg_id, MessageBytes bytes, Completion done) {
  RunOnProgress(*ctx_, this,
                [this, msg_id, bytes = std::move(bytes), done = std::move(done)]() mutable {
                  SendNow(msg_id, std::move(bytes), std::move(done));
                });
}

void VerbsEndpoint::SendNow(uint16_t msg_id, MessageBytes bytes, Completion done) {
  if (dead_ || closing_) {
    if (done) done(DeadStatus());
    return;
  }
  ctx_->counters_.messages_sent++;
  ctx_->counters_.message_bytes_sent += bytes.size();
  Pending p;
  p.is_message = true;
  p.msg_id = msg_id;
  p.bytes = std::move(bytes);
  p.done = std::move(done);
  pending_.push_back(std::move(p));
  Pump();
}

void VerbsEndpoint::Put(const void* local, size_t len, const RemoteRegion& remote,
                        uint64_t remote_addr, Completion done) {
  RunOnProgress(
      *ctx_, this, [this, local, len, &remote, remote_addr, done = std::move(done)]() mutable {
        RmaNow(Op::kWrite, const_cast<void*>(local), len, remote, remote_addr, std::move(done));
      });
}

void VerbsEndpoint::Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
                        Completion done) {
  RunOnProgress(*ctx_, this,
                [this, local, len, &remote, remote_addr, done = std::move(done)]() mutable {
                  RmaNow(Op::kRead, local, len, remote, remote_addr, std::move(done));
                });
}

void VerbsEndpoint::RmaNow(Op::Kind kind, void* local, size_t len, const RemoteRegion& remote,
                           uint64_t remote_addr, Completion done) {
  if (dead_ || qp_ == nullptr) return done(DeadStatus());
  auto rkey = RemoteKeyFor(this, remote, remote_addr, len, peer_);
  if (!rkey.ok()) return done(rkey.status());
  auto& c = ctx_->counters_;
  (kind == Op::kWrite ? c.puts : c.gets)++;
  (kind == Op::kWrite ? c.put_bytes : c.get_bytes) += len;
  Pending p;
  p.rma = kind;
  p.local = local;
  p.len = len;
  p.remote_addr = remote_addr;
  p.rkey = *rkey;
  p.rma_seq = ++rma_issued_;
  p.done = std::move(done);
  pending_.push_back(std::move(p));
  Pump();
}

void VerbsEndpoint::Flush(Completion done) {
  RunOnProgress(*ctx_, this,
                [this, done = std::move(done)]() mutable { FlushNow(std::move(done)); });
}

void VerbsEndpoint::FlushNow(Completion done) {
  if (dead_) return done(DeadStatus());
  // RC completes a queue pair's work requests in order, and a WRITE or READ
  // completes only once the peer acknowledged it: waiting for the last one
  // issued is waiting for all.
  if (rma_completed_ >= rma_issued_) return done(Status::Ok());
  flush_waiters_.emplace_back(rma_issued_, std::move(done));
}

// ---------------------------------------------------------------------------
// Posting

void VerbsEndpoint::Pump() {
  if (!alive_ || dead_) return;
  while (!pending_.empty() && sq_free_ > 0) {
    Pending& front = pending_.front();
    const bool finished = front.is_message ? PostFragment(front) : PostRma(front);
    if (!finished) break;  // waiting for credits or room; `front` keeps its progress
    pending_.pop_front();
  }
  if (closing_ && pending_.empty() && outstanding_ == 0 && !dead_) {
    rdma_disconnect(id_);
  }
}

bool VerbsEndpoint::PostFragment(Pending& msg) {
  while (sq_free_ > 0 && (msg.credit_only || send_credits_ > 0)) {
    Device::Slot* slot = ctx_->TakeSendSlot(*dev_);
    if (slot == nullptr) {
      MarkDead(RegistrationError(errno, VerbsContext::kSlotBytes * 64, "send buffers"), true);
      return false;
    }
    const size_t left = msg.bytes.size() - msg.sent;
    const auto len = static_cast<uint32_t>(std::min<size_t>(left, kFragmentPayload));
    FragmentHeader h{};
    h.msg_id = msg.msg_id;
    h.flags = static_cast<uint8_t>((msg.sent == 0 ? kFirst : 0) |
                                   (msg.sent + len == msg.bytes.size() ? kLast : 0) |
                                   (msg.credit_only ? kCreditOnly : 0));
    h.credits = credits_to_return_;
    credits_to_return_ = 0;
    h.total_len = static_cast<uint32_t>(msg.bytes.size());
    h.frag_len = len;
    std::memcpy(slot->data, &h, sizeof(h));
    if (len > 0) std::memcpy(slot->data + sizeof(h), msg.bytes.data() + msg.sent, len);
    msg.sent += len;
    const bool last = msg.sent == msg.bytes.size();

    auto* op = new Op{Op::kSend, this};
    op->slot = slot;
    if (last) op->done = std::move(msg.done);
    ibv_sge sge{reinterpret_cast<uintptr_t>(slot->data), static_cast<uint32_t>(sizeof(h) + len),
                slot->lkey};
    ibv_send_wr wr{};
    wr.wr_id = reinterpret_cast<uintptr_t>(op);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(qp_, &wr, &bad); err != 0) {
      dev_->free_send_slots.push_back(slot);
      delete op;
      MarkDead(Status::Unavailable("posting a send to " + peer_ + ": " + std::strerror(err)), true);
      return false;
    }
    sq_free_--;
    outstanding_++;
    if (!msg.credit_only) send_credits_--;
    if (last) return true;
  }
  return false;
}

bool VerbsEndpoint::PostRma(Pending& rma) {
  // Pieces no larger than the port's largest message.
  const size_t piece = dev_->max_msg_size;
  const size_t pieces = rma.len == 0 ? 1 : (rma.len + piece - 1) / piece;
  if (sq_free_ < pieces && pieces <= VerbsContext::kSendQueueDepth) return false;
  uint32_t lkey = ctx_->FindLkey(*dev_, rma.local, rma.len);
  ibv_mr* temp = nullptr;
  if (lkey == 0 && rma.len > 0) {
    // Not inside a registered region: register it for this operation only.
    // (Caching such registrations would be faster, but the memory may be
    // freed and reused by the caller, and a stale registration would then
    // move the wrong pages.)
    if (gpu::QueryPointer(rma.local).device) {
      auto mr = RegisterGpuMemory(*dev_, rma.local, rma.len, IBV_ACCESS_LOCAL_WRITE);
      if (!mr.ok()) {
        auto done = std::move(rma.done);
        done(mr.status().WithContext("a local GPU buffer"));
        return true;
      }
      temp = *mr;
    } else {
      temp = ibv_reg_mr(dev_->pd, rma.local, rma.len, IBV_ACCESS_LOCAL_WRITE);
    }
    if (temp == nullptr) {
      auto done = std::move(rma.done);
      done(RegistrationError(errno, rma.len, "a local buffer"));
      return true;
    }
    lkey = temp->lkey;
  }
  auto remaining = std::make_shared<int>(static_cast<int>(pieces));
  auto error = std::make_shared<Status>();
  for (size_t i = 0; i < pieces; ++i) {
    const size_t off = i * piece;
    const size_t len = std::min(piece, rma.len - off);
    auto* op = new Op{rma.rma, this};
    op->pieces = remaining;
    op->first_error = error;
    op->rma_seq = rma.rma_seq;
    if (i + 1 == pieces) {
      op->done = std::move(rma.done);
      op->temp_mr = temp;
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(rma.local) + off, static_cast<uint32_t>(len), lkey};
    ibv_send_wr wr{};
    wr.wr_id = reinterpret_cast<uintptr_t>(op);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = rma.rma == Op::kWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = rma.remote_addr + off;
    wr.wr.rdma.rkey = rma.rkey;
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(qp_, &wr, &bad); err != 0) {
      delete op;
      MarkDead(
          Status::Unavailable("posting an RDMA operation to " + peer_ + ": " + std::strerror(err)),
          true);
      return false;
    }
    sq_free_--;
    outstanding_++;
  }
  return true;
}

Result<const Device*> VerbsEndpoint::device() {
  return RunOnLoop(*ctx_, [&]() -> Result<const Device*> {
    if (dead_ || qp_ == nullptr || dev_ == nullptr) return DeadStatus();
    return static_cast<const Device*>(dev_);
  });
}

Result<uint32_t> VerbsEndpoint::BindWindow(ibv_mw* window, ibv_mr* mr, void* addr, size_t len) {
  return RunOnLoop(*ctx_, [&]() -> Result<uint32_t> {
    if (dead_ || qp_ == nullptr) return DeadStatus();
    if (sq_free_ == 0) {
      return Status::Unavailable("binding a memory window: the send queue to " + peer_ +
                                 " is full");
    }
    auto* op = new Op{Op::kBind, this};
    ibv_send_wr wr{};
    wr.wr_id = reinterpret_cast<uintptr_t>(op);
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = window;
    wr.bind_mw.rkey = ibv_inc_rkey(window->rkey);
    wr.bind_mw.bind_info.mr = mr;
    wr.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(addr);
    wr.bind_mw.bind_info.length = len;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(qp_, &wr, &bad); err != 0) {
      delete op;
      return Status::Unavailable("binding a memory window for " + peer_ + ": " +
                                 std::strerror(err));
    }
    sq_free_--;
    outstanding_++;
    return wr.bind_mw.rkey;
  });
}

// ---------------------------------------------------------------------------
// Completions

void VerbsEndpoint::OnCompletion(const ibv_wc& wc, Op* op) {
  sq_free_++;
  outstanding_--;
  const Status st = wc.status == IBV_WC_SUCCESS
                        ? Status::Ok()
                        : CompletionError(wc.status, peer_,
                                          op->kind == Op::kSend    ? "send"
                                          : op->kind == Op::kWrite ? "RDMA write"
                                          : op->kind == Op::kRead  ? "RDMA read"
                                                                   : "memory window bind");
  // The peer's side acknowledged the work request: a sign of life, one-sided
  // operations included (Endpoint::last_traffic).
  if (st.ok()) NoteTraffic();
  if (op->kind == Op::kSend) {
    dev_->free_send_slots.push_back(op->slot);
    if (op->done) op->done(st);
  } else if (op->kind == Op::kBind) {
    // Nothing waits on a bind: one that failed ends the connection below.
  } else {
    if (!st.ok() && op->first_error->ok()) *op->first_error = st;
    if (--*op->pieces == 0) {
      if (op->temp_mr) ibv_dereg_mr(op->temp_mr);
      rma_completed_ = std::max(rma_completed_, op->rma_seq);
      if (op->done) op->done(*op->first_error);
      std::erase_if(flush_waiters_, [this](auto& w) {
        if (w.first > rma_completed_) return false;
        w.second(Status::Ok());
        return true;
      });
    }
  }
  delete op;
  if (!st.ok() && !dead_ && wc.status != IBV_WC_WR_FLUSH_ERR) {
    // The queue pair is in error now: every later request fails too.
    MarkDead(st, true);
  }
  if (dead_) return MaybeDestroy();
  Pump();
}

void VerbsEndpoint::OnReceive(const uint8_t* data, uint32_t len) {
  if (len < sizeof(FragmentHeader)) {
    TLOG_WARN("{}: a {}-byte fragment from {} is too short; dropped", ctx_->options_.name, len,
              peer_);
    return;
  }
  NoteTraffic();  // every fragment, so a long message keeps its sender alive
  FragmentHeader h;
  std::memcpy(&h, data, sizeof(h));
  send_credits_ += h.credits;
  if (h.flags & kCreditOnly) {
    Pump();
    return;
  }
  credits_to_return_++;
  if (!announced_ && passive_) {
    // The peer may send as soon as it is connected, before our ESTABLISHED.
    announced_ = true;
    alive_ = true;
    if (on_accept_) on_accept_(shared_from_this());
  }
  if (h.frag_len > len - sizeof(FragmentHeader)) {
    TLOG_WARN("{}: a fragment from {} claims more bytes than it has; dropped", ctx_->options_.name,
              peer_);
    return;
  }
  std::span<const uint8_t> payload(data + sizeof(h), h.frag_len);
  auto self = shared_from_this();
  if ((h.flags & kFirst) && (h.flags & kLast)) {
    ctx_->Dispatch(self, h.msg_id, payload);
  } else {
    if (h.flags & kFirst) {
      if (h.total_len > message_limit()) {
        TLOG_WARN("{}: {} announced a {}-byte message, over the {}-byte limit; closing",
                  ctx_->options_.name, peer_, h.total_len, message_limit());
        ctx_->Post([self] { self->Abort(); });
        return;
      }
      inbox_.clear();
      inbox_.reserve(h.total_len);
      inbox_msg_ = h.msg_id;
      inbox_total_ = h.total_len;
      inbox_open_ = true;
    }
    if (inbox_open_ && payload.size() > inbox_total_ - inbox_.size()) {
      TLOG_WARN("{}: a message from {} ran past its announced {} bytes; closing",
                ctx_->options_.name, peer_, inbox_total_);
      inbox_open_ = false;
      inbox_ = {};
      ctx_->Post([self] { self->Abort(); });
      return;
    }
    if (inbox_open_) AppendBytes(&inbox_, payload);
    if ((h.flags & kLast) && inbox_open_) {
      inbox_open_ = false;
      MessageBytes message = std::move(inbox_);
      inbox_ = {};
      if (message.size() == inbox_total_) {
        ctx_->Dispatch(self, inbox_msg_, message);
      } else {
        TLOG_WARN("{}: a message from {} arrived with {} of {} bytes; dropped", ctx_->options_.name,
                  peer_, message.size(), inbox_total_);
      }
    }
  }
  ReturnCreditsIfDue();
  Pump();
}

void VerbsEndpoint::ReturnCreditsIfDue() {
  // Most credits ride back on fragments going the other way. When half of
  // the grant is owed and nothing queued can carry them (nothing is queued,
  // or what is queued itself waits for credits: both sides waiting on each
  // other), a credit-only fragment goes first; it needs no credit itself.
  if (credits_to_return_ < VerbsContext::kCredits / 2 || dead_) return;
  if (!pending_.empty() && send_credits_ > 0) return;
  if (!pending_.empty() && pending_.front().credit_only) return;
  Pending p;
  p.is_message = true;
  p.credit_only = true;
  pending_.push_front(std::move(p));
}

// ---------------------------------------------------------------------------
// Closing

void VerbsEndpoint::CloseWith(bool force) {
  auto run = [self = shared_from_this(), force] {
    if (self->dead_) return;
    if (!force && self->alive_) {
      self->closing_ = true;
      self->close_reason_ = Status::Unavailable("connection to " + self->peer_ + " closed");
      self->Pump();  // disconnects once what was sent is delivered
      return;
    }
    self->MarkDead(Status::Aborted("connection to " + self->peer_ + " aborted"), false);
  };
  if (ctx_->InProgressThread()) return run();
  ctx_->Post(std::move(run));
}

void VerbsEndpoint::MarkDead(const Status& why, bool report) {
  if (dead_) return;
  dead_ = true;
  alive_ = false;
  if (close_reason_.ok() || !closing_) close_reason_ = why;
  if (id_ != nullptr && qp_ != nullptr) rdma_disconnect(id_);  // flushes what is posted
  FailPending(close_reason_);
  if (connect_done_) {
    auto cb = std::move(connect_done_);
    connect_done_ = nullptr;
    cb(close_reason_);
  } else if (report && announced_ && !closing_ && !reported_ && ctx_->on_disconnect_) {
    reported_ = true;
    ctx_->on_disconnect_(shared_from_this(), close_reason_);
  }
  MaybeDestroy();
}

void VerbsEndpoint::FailPending(const Status& why) {
  std::deque<Pending> pending;
  pending.swap(pending_);
  for (auto& p : pending) {
    if (p.done) p.done(why);
  }
  auto waiters = std::move(flush_waiters_);
  flush_waiters_.clear();
  for (auto& w : waiters) w.second(why);
}

void VerbsEndpoint::MaybeDestroy() {
  if (!dead_ || outstanding_ > 0 || id_ == nullptr) return;
  // Flushed work requests have all completed: nothing refers to the QP.
  rdma_cm_id* id = id_;
  id_ = nullptr;
  if (qp_ != nullptr) {
    ctx_->by_qp_.erase(qp_->qp_num);
    qp_ = nullptr;
    rdma_destroy_qp(id);
  }
  auto node = ctx_->by_id_.extract(id);
  if (ctx_->stopped_) {
    rdma_destroy_id(id);
    return;
  }
  // Not in the middle of this turn's event handling: on the next turn, which
  // also drops the map's reference to this endpoint.
  std::shared_ptr<VerbsEndpoint> keep = node.empty() ? nullptr : std::move(node.mapped());
  ctx_->Post([id, keep] { rdma_destroy_id(id); });
}

std::string VerbsEndpoint::DescribeLanes() {
  return RunOnLoop(*ctx_, [this]() -> std::string {
    if (dead_ || qp_ == nullptr) return "closed";
    return "verbs RC qp " + std::to_string(qp_->qp_num) + " on " + dev_->name + " port " +
           std::to_string(id_->port_num) + " to " + peer_;
  });
}

}  // namespace tessera::transport::verbs
