#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/borrowed.h"
#include "core/log.h"
#include "transport/closed.h"
#include "transport/region_desc.h"
#include "transport/run_on_loop.h"
#include "transport/sockaddr.h"
#include "transport/tcp/tcp_context.h"

namespace tessera::transport::tcp {
namespace {

// Bytes read per recv into the endpoint's buffer; payloads at least
// kDirectBytes long that are not buffered yet go straight to their place.
constexpr size_t kReadBuffer = 64 * 1024;
// Until the peer authenticated, a small one: a flood of strangers' connections
// costs the listener that much each, not 64 KiB (what does not fit moves
// through the message buffer, bounded by the limit before authentication).
constexpr size_t kUnauthenticatedReadBuffer = 4 * 1024;
constexpr uint64_t kDirectBytes = 16 * 1024;
// Answers (get data, put acknowledgements) queued for a peer that does not
// read them: beyond this, the peer is dropped rather than held in memory.
constexpr size_t kMaxQueuedFrames = 1 << 16;
// Frame slots a connection keeps once its send queue drains (about 150 KiB):
// beyond them, a burst's storage goes back.
constexpr size_t kKeptQueueSlots = 1024;
// Sealed bytes prepared per turn for a protected session's socket.
constexpr size_t kSealBuffer = 64 * 1024;
// How long a graceful close waits for the peer to close its side.
constexpr std::chrono::milliseconds kCloseLinger{2000};

Status SocketError(const std::string& what, int err) {
  return Status::Unavailable(what + ": " + std::strerror(err));
}

}  // namespace

TcpEndpoint::TcpEndpoint(TcpContext* ctx, int fd, std::string peer, const ContextOptions& options)
    : Endpoint(options),
      ctx_(ctx),
      fd_(fd),
      peer_(std::move(peer)),
      rbuf_(new uint8_t[kUnauthenticatedReadBuffer]),
      rbuf_size_(kUnauthenticatedReadBuffer) {}

TcpEndpoint::~TcpEndpoint() {
  if (fd_ >= 0) close(fd_);
}

void TcpEndpoint::Run(Task fn) { RunOnProgress(*ctx_, this, std::move(fn)); }

Status TcpEndpoint::DeadStatus() const { return ClosedStatus(peer_, close_reason_); }

void TcpEndpoint::Send(uint16_t msg_id, MessageBytes bytes, Completion done) {
  ctx_->counters_.messages_sent++;
  ctx_->counters_.message_bytes_sent += bytes.size();
  Run([this, msg_id, bytes = std::move(bytes), done = std::move(done)]() mutable {
    OutFrame f;
    FrameHeader h;
    h.type = FrameType::kMessage;
    h.msg_id = msg_id;
    h.length = bytes.size();
    EncodeFrameHeader(h, f.header);
    f.owned = std::move(bytes);
    f.payload_len = f.owned.size();
    f.written = std::move(done);
    Queue(std::move(f));
  });
}

Result<std::unique_ptr<RemoteRegion>> TcpEndpoint::Attach(std::span<const uint8_t> description) {
  auto desc = DecodeRegionDesc(description);
  if (!desc.ok()) return desc.status().WithContext("from " + peer_);
  if (desc->backend != BackendId::kTcp) {
    return Status::InvalidArgument("remote key from " + peer_ + " is not a tcp key");
  }
  auto key = DecodeTcpKey(desc->key);
  if (!key.ok()) return key.status().WithContext("from " + peer_);
  return std::unique_ptr<RemoteRegion>(
      new TcpRemoteRegion(this, key->first, key->second, desc->base, desc->size));
}

void TcpEndpoint::Put(const void* local, size_t len, const RemoteRegion& remote,
                      uint64_t remote_addr, Completion done) {
  Issue(FrameType::kPut, const_cast<void*>(local), len, remote, remote_addr, std::move(done));
}

void TcpEndpoint::Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
                      Completion done) {
  Issue(FrameType::kGet, local, len, remote, remote_addr, std::move(done));
}

void TcpEndpoint::Issue(FrameType type, void* local, size_t len, const RemoteRegion& remote,
                        uint64_t remote_addr, Completion done) {
  const auto* r = dynamic_cast<const TcpRemoteRegion*>(&remote);
  if (r == nullptr || r->owner() != this) {
    return done(
        Status::InvalidArgument("remote region was not attached to the endpoint of " + peer_));
  }
  if (!remote.Contains(remote_addr, len)) {
    return done(Status::OutOfRange("one-sided access of " + std::to_string(len) +
                                   " bytes lies outside the region of " + peer_));
  }
  if (type == FrameType::kPut) {
    ctx_->counters_.puts++;
    ctx_->counters_.put_bytes += len;
  } else {
    ctx_->counters_.gets++;
    ctx_->counters_.get_bytes += len;
  }
  // The region, not a header built here, goes to the loop: the task then
  // holds its Completion in place (a posted Task is 136 bytes). The caller
  // keeps the region attached while the operation is issued, as with UCX.
  Run([this, type, r, remote_addr, local, len, done = std::move(done)]() mutable {
    if (dead_ || closing_) return done(DeadStatus());
    const uint64_t id = next_op_++;
    ops_.emplace(id, Op{type, static_cast<uint8_t*>(local), len, std::move(done)});
    ops_issued_++;
    OutFrame f;
    FrameHeader h;
    h.type = type;
    h.region = r->id();
    h.key = r->key();
    h.addr = remote_addr;
    h.length = len;
    h.op = id;
    EncodeFrameHeader(h, f.header);
    if (type == FrameType::kPut) {
      f.payload = static_cast<const uint8_t*>(local);
      f.payload_len = len;
    }
    Queue(std::move(f));
  });
}

void TcpEndpoint::Flush(Completion done) {
  Run([this, done = std::move(done)]() mutable {
    if (dead_) return done(DeadStatus());
    // Answers come back in issue order: the flush waits for those issued so far.
    if (ops_completed_ == ops_issued_) return done(Status::Ok());
    flush_waiters_.push_back({ops_issued_, std::move(done)});
  });
}

void TcpEndpoint::Close() {
  Run([this] {
    if (dead_ || closing_) return;
    closing_ = true;
    close_reason_ = Status::Unavailable("closed by this side");
    if (Drained()) {
      shutdown(fd_, SHUT_WR);
      write_shut_ = true;
    }
    // The peer answers the shutdown by closing its side; one that does not
    // is cut off after the linger.
    std::weak_ptr<TcpEndpoint> weak = shared_from_this();
    ctx_->PostAfter(kCloseLinger, [weak] {
      if (auto ep = weak.lock()) ep->MarkDead(Status::Unavailable("closed by this side"), false);
    });
  });
}

void TcpEndpoint::Abort() {
  Run([this] {
    if (dead_) return;
    linger hard{1, 0};  // a reset, not an orderly close: nothing more is sent
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
    MarkDead(Status::Aborted("aborted by this side"), false);
  });
}

std::string TcpEndpoint::DescribeLanes() { return "tcp (Tessera's sockets) to " + peer_; }

bool TcpEndpoint::PeerOnLoopback() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int fd = fd_;
  return fd >= 0 && getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
         IsLoopbackAddress(addr);
}

Status TcpEndpoint::ProtectSession(const SessionKeys& keys) {
  auto seal = SessionCipher::Create(
      keys.send, {.direction = SessionCipher::Direction::kSeal, .encrypt = keys.encrypt});
  if (!seal.ok()) return seal.status();
  auto open = SessionCipher::Create(
      keys.receive, {.direction = SessionCipher::Direction::kOpen, .encrypt = keys.encrypt});
  if (!open.ok()) return open.status();
  Run([this, seal = std::shared_ptr<SessionCipher>(std::move(*seal)),
       open = std::shared_ptr<SessionCipher>(std::move(*open))]() mutable {
    if (dead_ || seal_) return;
    seal_ = std::move(seal);
    open_ = std::move(open);
    MarkProtected();
  });
  return Status::Ok();
}

void TcpEndpoint::Queue(OutFrame frame) {
  if (dead_) {
    if (frame.written) frame.written(DeadStatus());
    return;
  }
  frame.sealed = seal_ != nullptr;
  out_.push_back(std::move(frame));
  sending_++;
  WriteSome();
  sending_--;
  UpdateInterest();
}

bool TcpEndpoint::WriteSome() {
  // The completions run after the writes, and may send again (a nested
  // WriteSome borrows an empty list then).
  Borrowed<std::vector<Completion>> borrowed(written_);
  std::vector<Completion>& written = *borrowed;
  while (!dead_ && !connecting_ && !Drained()) {
    if (sealed_pos_ < sealed_end_ || out_.front().sealed) {
      if (!WriteSealed(written)) break;
      continue;
    }
    iovec iov[128];
    int n = 0;
    size_t frames = 0;
    for (size_t i = 0; i < out_.size() && n < 126 && !out_[i].sealed; ++i, ++frames) {
      OutFrame* it = &out_[i];
      size_t skip = it->sent;
      if (skip < it->header_len) {
        iov[n++] = {it->header.data() + skip, it->header_len - skip};
        skip = 0;
      } else {
        skip -= it->header_len;
      }
      const uint8_t* payload = it->owned.empty() ? it->payload : it->owned.data();
      if (it->payload_len > skip) {
        iov[n++] = {const_cast<uint8_t*>(payload) + skip, it->payload_len - skip};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w;
    int send_errno;
    {
      // A get's answer is read from its region: still there, and kept, while it is sent.
      std::optional<RegionTable::Pinned> pinned;
      if (Status held = PinAnswers(frames, &pinned); !held.ok()) {
        pinned.reset();
        Refuse(held);
        break;
      }
      w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
      send_errno = errno;
    }
    errno = send_errno;
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      MarkDead(SocketError("sending to " + peer_ + " failed", errno), true);
      break;
    }
    size_t left = static_cast<size_t>(w);
    while (left > 0 && !out_.empty()) {
      OutFrame& f = out_.front();
      const size_t total = f.header_len + f.payload_len;
      const size_t take = std::min(left, total - f.sent);
      f.sent += take;
      left -= take;
      if (f.sent < total) break;
      if (f.written) written.push_back(std::move(f.written));
      out_.pop_front();
    }
  }
  if (!dead_ && Drained() && closing_ && !write_shut_) {
    shutdown(fd_, SHUT_WR);
    write_shut_ = true;
  }
  for (auto& done : written) done(Status::Ok());
  written.clear();
  // Steady traffic keeps the queue's slots; a burst gives them back.
  out_.ReleaseIfEmptyAbove(kKeptQueueSlots);
  return Drained();
}

bool TcpEndpoint::WriteSealed(std::vector<Completion>& written) {
  if (sealed_pos_ == sealed_end_) {
    if (Status st = SealMore(); !st.ok()) {
      Refuse(st);
      return false;
    }
  }
  const ssize_t w = send(fd_, sealed_.get() + sealed_pos_, sealed_end_ - sealed_pos_, MSG_NOSIGNAL);
  if (w < 0) {
    if (errno == EINTR) return true;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      MarkDead(SocketError("sending to " + peer_ + " failed", errno), true);
    }
    return false;
  }
  sealed_pos_ += static_cast<size_t>(w);
  if (sealed_pos_ == sealed_end_) {
    for (auto& done : sealed_written_) written.push_back(std::move(done));
    sealed_written_.clear();
  }
  return true;
}

Status TcpEndpoint::SealMore() {
  if (!sealed_) sealed_.reset(new uint8_t[kSealBuffer]);
  sealed_pos_ = sealed_end_ = 0;
  while (!out_.empty() && out_.front().sealed) {
    OutFrame& f = out_.front();
    // A message is one record, its header and body; a put's or get's
    // header is one, its payload another (the target checks the header
    // before it writes or reads memory).
    const bool one_record = f.header[0] == static_cast<uint8_t>(FrameType::kMessage);
    if (f.sent == 0) {
      if (kSealBuffer - sealed_end_ < kFrameHeaderBytes + kSealTagBytes) break;
      seal_->Begin();
      seal_->Update(f.header.data(), sealed_.get() + sealed_end_, kFrameHeaderBytes);
      sealed_end_ += kFrameHeaderBytes;
      if (!one_record) {
        seal_->EndSeal(sealed_.get() + sealed_end_);
        sealed_end_ += kSealTagBytes;
        if (f.payload_len > 0) seal_->Begin();
      }
      f.sent = kFrameHeaderBytes;
    }
    size_t done = f.sent - kFrameHeaderBytes;
    if (done < f.payload_len) {
      const size_t take = std::min(kSealBuffer - sealed_end_, f.payload_len - done);
      if (take == 0) break;
      const uint8_t* from = (f.owned.empty() ? f.payload : f.owned.data()) + done;
      // A get's answer is read from its region: still there while sealed.
      std::optional<RegionTable::Pinned> pinned;
      if (f.region != 0) {
        pinned.emplace(ctx_->regions_->Pin());
        auto at = pinned->Find(f.region, f.key, reinterpret_cast<uint64_t>(from), take,
                               RemoteAccess::kRead, serial());
        if (!at.ok()) return at.status().WithContext("a one-sided read by " + peer_ + ", midway");
        from = *at;
      }
      seal_->Update(from, sealed_.get() + sealed_end_, take);
      sealed_end_ += take;
      f.sent += take;
      done += take;
      if (done < f.payload_len) break;
    }
    if (one_record || f.payload_len > 0) {
      if (kSealBuffer - sealed_end_ < kSealTagBytes) break;
      seal_->EndSeal(sealed_.get() + sealed_end_);
      sealed_end_ += kSealTagBytes;
    }
    if (f.written) sealed_written_.push_back(std::move(f.written));
    out_.pop_front();
  }
  return Status::Ok();
}

void TcpEndpoint::UpdateInterest() {
  if (dead_) return;
  const bool want = connecting_ || !Drained();
  if (want == want_write_) return;
  want_write_ = want;
  ctx_->Rewatch(fd_, token_, EPOLLIN | (want ? EPOLLOUT : 0u));
}

void TcpEndpoint::OnEvents(uint32_t events) {
  auto self = shared_from_this();  // callbacks below may drop the context's reference
  if (connecting_ && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return MarkDead(SocketError("connection to " + peer_ + " failed", err), false);
    }
    OnConnected();
  }
  if (!dead_ && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) ReadSome();
  if (!dead_ && (events & EPOLLOUT)) WriteSome();
  UpdateInterest();
}

bool TcpEndpoint::ReadNow() {
  if (dead_ || connecting_) return false;
  auto self = shared_from_this();  // callbacks below may drop the context's reference
  const uint64_t before = reads_;
  ReadSome();
  UpdateInterest();
  return reads_ != before;
}

void TcpEndpoint::OnConnected() {
  connecting_ = false;
  OutFrame preamble;
  std::copy(kPreamble.begin(), kPreamble.end(), preamble.header.begin());
  preamble.header_len = kPreamble.size();
  out_.push_front(std::move(preamble));
  WriteSome();
}

void TcpEndpoint::ReadSome() {
  // Bounded per turn, so one busy peer does not starve the others.
  for (int round = 0; round < 16 && !dead_; ++round) {
    ssize_t r = 0;
    const bool buffered = rpos_ < rend_;
    if (state_ == RecvState::kPayload && !buffered && payload_left_ >= kDirectBytes && !closing_) {
      // A large payload goes straight into its region or buffer.
      const size_t want = static_cast<size_t>(std::min<uint64_t>(payload_left_, SSIZE_MAX));
      std::optional<RegionTable::Pinned> pinned;
      auto place = PayloadPlace(want, &pinned);
      if (!place.ok()) return Refuse(place.status());
      r = recv(fd_, *place, want, 0);
      const int recv_errno = errno;
      if (r > 0 && payload_sealed_) open_->Update(*place, *place, static_cast<size_t>(r));
      pinned.reset();
      errno = recv_errno;
      if (r > 0) {
        NoteTraffic();
        reads_++;
        payload_dst_ += r;
        payload_left_ -= static_cast<uint64_t>(r);
        if (payload_left_ == 0) {
          if (Status st = OnPayloadEnd(); !st.ok()) return Refuse(st);
        }
        if (static_cast<size_t>(r) < want) return;  // drained: see below
        continue;
      }
    } else {
      if (!buffered) rpos_ = rend_ = 0;
      if (rbuf_size_ < kReadBuffer && authenticated()) GrowReadBuffer();
      if (rend_ == rbuf_size_) {  // a partial frame at the end: move it to the front
        std::memmove(rbuf_.get(), rbuf_.get() + rpos_, rend_ - rpos_);
        rend_ -= rpos_;
        rpos_ = 0;
      }
      const size_t room = rbuf_size_ - rend_;
      r = recv(fd_, rbuf_.get() + rend_, room, 0);
      if (r > 0) {
        NoteTraffic();
        reads_++;
        rend_ += static_cast<size_t>(r);
        // A read shorter than asked emptied the socket's queue: the next
        // recv would only say EAGAIN, one system call per message in vain.
        // The fd is watched level-triggered, so bytes that arrive later
        // raise the next event.
        const bool drained = static_cast<size_t>(r) < room;
        if (closing_) {
          rpos_ = rend_ = 0;  // closing: what the peer still sends is not read
        } else if (!Parse()) {
          return;
        }
        if (drained) return;
        continue;
      }
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r < 0 && errno == EINTR) continue;
    if (closing_) return MarkDead(Status::Unavailable("closed by this side"), false);
    if (r == 0) return MarkDead(Status::Unavailable("closed by " + peer_), true);
    return MarkDead(SocketError("receiving from " + peer_ + " failed", errno), true);
  }
}

void TcpEndpoint::GrowReadBuffer() {
  std::unique_ptr<uint8_t[]> bigger(new uint8_t[kReadBuffer]);
  std::memcpy(bigger.get(), rbuf_.get() + rpos_, rend_ - rpos_);
  rend_ -= rpos_;
  rpos_ = 0;
  rbuf_ = std::move(bigger);
  rbuf_size_ = kReadBuffer;
}

bool TcpEndpoint::Parse() {
  while (!dead_ && rpos_ < rend_) {
    const size_t avail = rend_ - rpos_;
    const uint8_t* in = rbuf_.get() + rpos_;
    if (state_ != RecvState::kPayload) {
      const size_t need = HeaderNeed();
      const size_t take = std::min(avail, need - hdr_got_);
      std::memcpy(hdr_.data() + hdr_got_, in, take);
      hdr_got_ += take;
      rpos_ += take;
      if (hdr_got_ < need) return true;
      hdr_got_ = 0;
      Status st = state_ == RecvState::kPreamble    ? OnPreamble()
                  : state_ == RecvState::kTag       ? OnTag()
                  : state_ == RecvState::kHeaderTag ? OnHeaderTag()
                                                    : OnHeader();
      if (!st.ok()) {
        Refuse(st);
        return false;
      }
      continue;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(avail, payload_left_));
    {
      std::optional<RegionTable::Pinned> pinned;
      auto place = PayloadPlace(take, &pinned);
      if (!place.ok()) {
        Refuse(place.status());
        return false;
      }
      if (payload_sealed_) {
        open_->Update(in, *place, take);
      } else {
        std::memcpy(*place, in, take);
      }
    }
    payload_dst_ += take;
    payload_left_ -= take;
    rpos_ += take;
    if (payload_left_ == 0) {
      if (Status st = OnPayloadEnd(); !st.ok()) {
        Refuse(st);
        return false;
      }
    }
  }
  return !dead_;
}

Status TcpEndpoint::OnPreamble() {
  if (!std::equal(kPreamble.begin(), kPreamble.end(), hdr_.begin())) {
    return Status::FailedPrecondition(
        peer_ +
        " does not speak Tessera's tcp transport (is it started with another "
        "--transport?)");
  }
  state_ = RecvState::kHeader;
  if (connect_done_) {
    auto done = std::move(connect_done_);
    connect_done_ = nullptr;
    done(std::shared_ptr<Endpoint>(shared_from_this()));
  }
  return Status::Ok();
}

void TcpEndpoint::StartPayload(uint8_t* dst, uint64_t len, bool record_begun) {
  payload_dst_ = dst;
  payload_left_ = len;
  payload_region_ = 0;
  state_ = RecvState::kPayload;
  payload_sealed_ = record_begun || (open_ != nullptr && len > 0);
  if (payload_sealed_ && !record_begun) open_->Begin();
}

size_t TcpEndpoint::HeaderNeed() const {
  switch (state_) {
    case RecvState::kPreamble:
      return kPreamble.size();
    case RecvState::kTag:
    case RecvState::kHeaderTag:
      return kSealTagBytes;
    default:
      return kFrameHeaderBytes;
  }
}

Status TcpEndpoint::OnPayloadEnd() {
  if (!payload_sealed_) return OnPayloadDone();
  state_ = RecvState::kTag;
  return Status::Ok();
}

Status TcpEndpoint::OnTag() {
  payload_sealed_ = false;
  if (!open_->EndOpen(hdr_.data())) return IntegrityFailure("a payload");
  return OnPayloadDone();
}

Status TcpEndpoint::IntegrityFailure(const char* what) const {
  return Status::DataLoss(std::string(what) + " from " + peer_ +
                          " failed its integrity check: the session was altered in transit "
                          "(or the peer's keys differ)");
}

Result<uint8_t*> TcpEndpoint::PayloadPlace(uint64_t len,
                                           std::optional<RegionTable::Pinned>* pinned) {
  if (payload_region_ == 0) return payload_dst_;
  pinned->emplace(ctx_->regions_->Pin());
  auto at = (*pinned)->Find(payload_region_, payload_key_, reinterpret_cast<uint64_t>(payload_dst_),
                            len, RemoteAccess::kWrite, serial());
  if (!at.ok()) return at.status().WithContext("a one-sided write from " + peer_ + ", midway");
  return *at;
}

Status TcpEndpoint::PinAnswers(size_t frames, std::optional<RegionTable::Pinned>* pinned) {
  for (size_t i = 0; i < frames && i < out_.size(); ++i) {
    const OutFrame& f = out_[i];
    if (f.region == 0) continue;
    if (!*pinned) pinned->emplace(ctx_->regions_->Pin());
    auto at = (*pinned)->Find(f.region, f.key, reinterpret_cast<uint64_t>(f.payload), f.payload_len,
                              RemoteAccess::kRead, serial());
    if (!at.ok()) return at.status().WithContext("a one-sided read by " + peer_ + ", midway");
  }
  return Status::Ok();
}

Status TcpEndpoint::OnHeader() {
  if (open_) {
    // Decrypted, not yet checked: a message's record goes on with its body
    // (its tag follows the body), any other frame's tag follows now.
    open_->Begin();
    open_->Update(hdr_.data(), hdr_.data(), kFrameHeaderBytes);
  }
  auto h = DecodeFrameHeader(
      std::span<const uint8_t, kFrameHeaderBytes>(hdr_.data(), kFrameHeaderBytes));
  if (!h.ok()) {
    return open_ ? IntegrityFailure("a frame header") : h.status().WithContext("from " + peer_);
  }
  cur_ = *h;
  state_ = RecvState::kHeader;
  if (open_ && cur_.type != FrameType::kMessage) {
    state_ = RecvState::kHeaderTag;
    return Status::Ok();
  }
  return OnCheckedHeader();
}

Status TcpEndpoint::OnHeaderTag() {
  if (!open_->EndOpen(hdr_.data())) return IntegrityFailure("a frame header");
  state_ = RecvState::kHeader;
  return OnCheckedHeader();
}

Status TcpEndpoint::OnCheckedHeader() {
  switch (cur_.type) {
    case FrameType::kMessage: {
      if (cur_.length > message_limit()) {
        return Status::ResourceExhausted(peer_ + " sent a " + std::to_string(cur_.length) +
                                         "-byte message, over the " +
                                         std::to_string(message_limit()) + "-byte limit" +
                                         (authenticated() ? "" : " before authentication"));
      }
      // (Protected: the length is not checked yet, but bounded by the
      // limit; nothing is handed over before the tag checks out.)
      const size_t len = static_cast<size_t>(cur_.length);
      const size_t tag = open_ ? kSealTagBytes : 0;
      if (rend_ - rpos_ >= len + tag) {
        // All of it is buffered: handed over in place, without a copy.
        if (open_) {
          open_->Update(rbuf_.get() + rpos_, rbuf_.get() + rpos_, len);
          if (!open_->EndOpen(rbuf_.get() + rpos_ + len)) return IntegrityFailure("a message");
        }
        const std::span<const uint8_t> bytes(rbuf_.get() + rpos_, len);
        rpos_ += len + tag;
        ctx_->Dispatch(shared_from_this(), cur_.msg_id, bytes);
        return Status::Ok();
      }
      message_.resize(len);
      StartPayload(message_.data(), len, /*record_begun=*/open_ != nullptr);
      return len == 0 ? OnPayloadEnd() : Status::Ok();
    }
    case FrameType::kPut:
    case FrameType::kGet: {
      const bool put = cur_.type == FrameType::kPut;
      if (!authenticated()) {
        return Status::PermissionDenied(peer_ + " asked for a one-sided " +
                                        (put ? "write" : "read") + " before authenticating");
      }
      if (put && read_only()) {
        return Status::PermissionDenied(peer_ +
                                        " may only read one-sided (a reader or an observer), and "
                                        "asked to write");
      }
      // Checked now, to refuse at once, and again for each piece moved.
      auto at =
          ctx_->regions_->Pin().Find(cur_.region, cur_.key, cur_.addr, cur_.length,
                                     put ? RemoteAccess::kWrite : RemoteAccess::kRead, serial());
      if (!at.ok()) return at.status().WithContext("one-sided access from " + peer_);
      if (put) {
        StartPayload(*at, cur_.length);
        payload_region_ = cur_.region;
        payload_key_ = cur_.key;
        return cur_.length == 0 ? OnPayloadDone() : Status::Ok();
      }
      if (out_.size() >= kMaxQueuedFrames) {
        return Status::ResourceExhausted(peer_ + " asks for data without reading the answers");
      }
      OutFrame f;
      FrameHeader answer;
      answer.type = FrameType::kGetData;
      answer.op = cur_.op;
      answer.length = cur_.length;
      EncodeFrameHeader(answer, f.header);
      f.payload = *at;
      f.payload_len = static_cast<size_t>(cur_.length);
      f.region = cur_.region;
      f.key = cur_.key;
      Queue(std::move(f));
      return Status::Ok();
    }
    case FrameType::kPutDone:
    case FrameType::kGetData: {
      auto it = ops_.find(cur_.op);
      const FrameType asked = cur_.type == FrameType::kPutDone ? FrameType::kPut : FrameType::kGet;
      if (it == ops_.end() || it->second.type != asked ||
          cur_.length != (asked == FrameType::kGet ? it->second.len : 0)) {
        return Status::InvalidArgument(peer_ + " answered an operation this side did not ask for");
      }
      if (asked == FrameType::kPut) {
        CompleteOp(cur_.op, Status::Ok());
        return Status::Ok();
      }
      StartPayload(it->second.local, cur_.length);
      return cur_.length == 0 ? OnPayloadDone() : Status::Ok();
    }
  }
  return Status::InvalidArgument("unknown tcp frame from " + peer_);
}

Status TcpEndpoint::OnPayloadDone() {
  state_ = RecvState::kHeader;
  switch (cur_.type) {
    case FrameType::kMessage: {
      MessageBytes bytes = std::move(message_);
      message_ = {};
      ctx_->Dispatch(shared_from_this(), cur_.msg_id, bytes);
      return Status::Ok();
    }
    case FrameType::kPut: {
      if (out_.size() >= kMaxQueuedFrames) {
        return Status::ResourceExhausted(peer_ + " writes without reading the answers");
      }
      OutFrame f;
      FrameHeader answer;
      answer.type = FrameType::kPutDone;
      answer.op = cur_.op;
      EncodeFrameHeader(answer, f.header);
      Queue(std::move(f));
      return Status::Ok();
    }
    case FrameType::kGetData:
      CompleteOp(cur_.op, Status::Ok());
      return Status::Ok();
    default:
      return Status::Internal("payload for a frame that has none");
  }
}

void TcpEndpoint::CompleteOp(uint64_t id, const Status& st) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Completion done = std::move(it->second.done);
  ops_.erase(it);
  ops_completed_++;
  if (done) done(st);
  while (!flush_waiters_.empty() && flush_waiters_.front().first <= ops_completed_) {
    Completion flushed = std::move(flush_waiters_.front().second);
    flush_waiters_.pop_front();
    flushed(Status::Ok());
  }
}

void TcpEndpoint::Refuse(const Status& why) {
  uint64_t held_back = 0;
  if (authenticated() || ctx_->refusal_log_.Allow(LogThrottle::Clock::now(), &held_back)) {
    TLOG_WARN("{}: closing the connection from {}: {}{}", ctx_->options_.name, peer_,
              why.ToString(),
              held_back == 0 ? ""
                             : " (and " + std::to_string(held_back) +
                                   " more connections of unauthenticated peers, not logged)");
  }
  MarkDead(why, true);
}

void TcpEndpoint::MarkDead(const Status& why, bool report) {
  if (dead_) return;
  auto self = shared_from_this();
  dead_ = true;
  if (close_reason_.ok() || !closing_) close_reason_ = why;
  ctx_->Unwatch(fd_, token_);
  close(fd_);
  fd_ = -1;
  ctx_->Forget(token_);
  const Status dead = DeadStatus();
  auto ops = std::move(ops_);
  ops_.clear();
  auto waiters = std::move(flush_waiters_);
  flush_waiters_.clear();
  auto out = std::move(out_);
  out_.clear();
  auto sealed_written = std::move(sealed_written_);
  sealed_written_.clear();
  if (connect_done_) {
    auto done = std::move(connect_done_);
    connect_done_ = nullptr;
    done(why);
    report = false;  // it never connected: nobody was told it had
  }
  for (auto& [id, op] : ops) {
    if (op.done) op.done(dead);
  }
  for (; !waiters.empty(); waiters.pop_front()) waiters.front().second(dead);
  for (auto& done : sealed_written) done(dead);
  for (; !out.empty(); out.pop_front()) {
    if (out.front().written) out.front().written(dead);
  }
  if (!report || closing_ || !ctx_->on_disconnect_) return;
  if (sending_ > 0) {
    // Inside a caller's Send, often a handler answering this very peer: it
    // must not see the peer torn down under it (the shard's reply to a
    // push, then its step count, read the peer). Reported on the loop's
    // next turn instead; whoever holds the endpoint keeps it alive.
    ctx_->Post([ctx = ctx_, weak = std::weak_ptr<TcpEndpoint>(self), why] {
      if (auto ep = weak.lock(); ep && ctx->on_disconnect_) ctx->on_disconnect_(ep, why);
    });
    return;
  }
  ctx_->on_disconnect_(self, why);
}

}  // namespace tessera::transport::tcp
