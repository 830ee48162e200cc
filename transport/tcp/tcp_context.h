// Tessera's own tcp backend: plain sockets and epoll, no fabric library.
//
// UCX's tcp transport emulates one-sided operations in software and checks
// neither keys nor access flags, and its connection manager accepts whoever
// connects (docs/security.md). Here every byte a peer sends is read, checked
// and written by Tessera:
// - messages are length-prefixed frames, refused above the endpoint's limit
//   before anything is allocated for them;
// - a put or get is a frame that the target's progress thread serves after
//   checking region, key, access and bounds, and only once the layer above
//   marked the endpoint authenticated; payloads go straight between the
//   socket and the region (or the initiator's buffer), without copies;
// - completions come back in issue order (one stream), so a flush is a wait
//   for the operations issued before it.
// Progress: one epoll set of listeners and connections, which the EventLoop
// sleeps on.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/log_throttle.h"
#include "core/pool_allocator.h"
#include "core/ring_queue.h"
#include "transport/atomic_counters.h"
#include "transport/event_loop.h"
#include "transport/loop_context.h"
#include "transport/message_handlers.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_region.h"
#include "transport/tcp/tcp_session_cipher.h"
#include "transport/transport.h"

namespace tessera::transport::tcp {

class TcpEndpoint;

class TcpContext final : public LoopContext {
 public:
  static Result<std::unique_ptr<Context>> Create(const ContextOptions& options);
  ~TcpContext() override;

  Status CanRegister(MemoryKind kind) const override;
  bool CanProtectSessions() const override { return true; }
  Result<std::unique_ptr<Region>> Allocate(size_t size, MemoryKind kind,
                                           RemoteAccess access) override;
  Result<std::unique_ptr<Region>> Register(void* data, size_t size, MemoryKind kind,
                                           RemoteAccess access) override;
  void SetHandler(uint16_t msg_id, MessageHandler handler) override;
  void SetDisconnectHandler(DisconnectHandler handler) override;
  Result<std::unique_ptr<Listener>> Listen(const std::string& host, uint16_t port,
                                           AcceptHandler on_accept) override;
  void Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
               ConnectCallback done) override;
  Counters counters() const override;
  std::string Describe() const override;

 private:
  friend class TcpEndpoint;
  friend class TcpListener;

  // What an epoll event refers to: a listening socket or a connection, by a
  // token never reused (a closed fd's number may be, within one batch).
  struct ListenState {
    int fd = -1;
    AcceptHandler on_accept;
    bool paused = false;  // out of descriptors: retried shortly
  };

  explicit TcpContext(ContextOptions options) : options_(std::move(options)) {}
  // TCP_NODELAY, and the congestion control asked for.
  void TuneSocket(int fd) const;
  Status Init();
  Result<std::unique_ptr<Region>> MakeRegion(uint8_t* data, size_t size, RemoteAccess access,
                                             bool owned);

  // Progress-thread side.
  bool Progress();
  void OnListenerReadable(uint64_t token);
  uint64_t Watch(int fd, uint32_t events);
  void Rewatch(int fd, uint64_t token, uint32_t events);
  void Unwatch(int fd, uint64_t token);
  void Dispatch(const std::shared_ptr<TcpEndpoint>& ep, uint16_t msg_id,
                std::span<const uint8_t> bytes);
  void Forget(uint64_t token) { endpoints_.erase(token); }

  ContextOptions options_;
  std::unique_ptr<EventLoop> loop_;
  int epoll_fd_ = -1;
  std::shared_ptr<RegionTable> regions_ = std::make_shared<RegionTable>();
  AtomicCounters counters_;
  // Lines about connections from unauthenticated peers closed for breaking
  // the protocol: at most 10 a minute (the loop thread's).
  LogThrottle refusal_log_{10, std::chrono::minutes(1)};

  // Set before connections exist, then only read.
  MessageHandlers handlers_{options_.name};
  DisconnectHandler on_disconnect_;

  // Progress thread only.
  uint64_t next_token_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<TcpEndpoint>> endpoints_;
  // The connection that alone had something to read at the last look: read
  // first, directly, on every turn (TcpEndpoint::ReadNow).
  std::weak_ptr<TcpEndpoint> recent_reader_;
  std::unordered_map<uint64_t, ListenState> listeners_;
};

class TcpEndpoint final : public Endpoint, public std::enable_shared_from_this<TcpEndpoint> {
 public:
  TcpEndpoint(TcpContext* ctx, int fd, std::string peer, const ContextOptions& options);
  ~TcpEndpoint() override;

  void Send(uint16_t msg_id, MessageBytes bytes, Completion done) override;
  Result<std::unique_ptr<RemoteRegion>> Attach(std::span<const uint8_t> description) override;
  void Put(const void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Flush(Completion done) override;
  // One socket, whose frames the peer's progress thread serves in order.
  bool PutsLandBeforeLaterMessages() const override { return true; }
  // Each put or get is a frame of its own (a get two: asked, answered), with
  // its header, its completion and a turn of the peer's loop
  // (docs/PERFORMANCE.md, "Batched small chunks").
  size_t GatherUpTo() const override { return 16u << 10; }
  Status ProtectSession(const SessionKeys& keys) override;
  bool CanProtectSession() const override { return true; }
  bool PeerOnLoopback() const override;
  void Close() override;
  void Abort() override;
  std::string peer() const override { return peer_; }
  std::string DescribeLanes() override;

 private:
  friend class TcpContext;

  // A frame queued for the socket. The payload is the caller's buffer (a
  // put), a region's memory (a get's answer) or `owned` (a message).
  struct OutFrame {
    std::array<uint8_t, kFrameHeaderBytes> header{};
    uint8_t header_len = kFrameHeaderBytes;
    const uint8_t* payload = nullptr;
    size_t payload_len = 0;
    // A get's answer: the payload lies in this region (as the peer named
    // it), found again for each send; 0: in the sender's own memory.
    uint32_t region = 0;
    RegionKey key{};
    MessageBytes owned;
    Completion written;   // messages: once on the wire
    size_t sent = 0;      // of header_len + payload_len (sealed: of them sealed)
    bool sealed = false;  // queued after ProtectSession: goes out through sealed_
  };
  // A put or get waiting for the peer's answer.
  struct Op {
    FrameType type;
    uint8_t* local = nullptr;  // a get's destination
    size_t len = 0;
    Completion done;
  };
  // kTag: a protected payload's (or message's) tag is due; kHeaderTag: a
  // protected put's or get's header's.
  enum class RecvState { kPreamble, kHeader, kPayload, kTag, kHeaderTag };

  void Run(Task fn);
  void Queue(OutFrame frame);
  void Issue(FrameType type, void* local, size_t len, const RemoteRegion& remote,
             uint64_t remote_addr, Completion done);
  // Writes what the socket takes; true when the queue is empty.
  bool WriteSome();
  // Nothing queued, and no sealed bytes waiting for the socket.
  bool Drained() const { return out_.empty() && sealed_pos_ == sealed_end_; }
  // Protected frames: seals the queue's next frames into sealed_ once it
  // is empty, then sends from it; false once the socket takes no more.
  bool WriteSealed(std::vector<Completion>& written);
  Status SealMore();
  // How many bytes the header (or tag) being collected needs.
  size_t HeaderNeed() const;
  // The payload's last byte arrived: its tag is next if it was sealed.
  Status OnPayloadEnd();
  Status OnTag();
  Status IntegrityFailure(const char* what) const;
  void OnEvents(uint32_t events);
  void OnConnected();
  // What the socket holds now, read as an EPOLLIN event would read it,
  // without asking epoll first; true when anything was read. A connection
  // that talks back and forth with one peer (a worker's calls to a shard)
  // then costs a recv per message, as a plain socket does, before the
  // epoll_wait that would have reported it (a measurable share of a small
  // round trip: docs/PERFORMANCE.md's tcp rows).
  bool ReadNow();
  void ReadSome();
  // Consumes bytes from the read buffer; false once the endpoint died.
  bool Parse();
  // After authentication: the full-size read buffer, what it held kept.
  void GrowReadBuffer();
  Status OnPreamble();
  Status OnHeader();
  Status OnHeaderTag();
  // The header is known good (checked, or unprotected): act on it.
  Status OnCheckedHeader();
  Status OnPayloadDone();
  void CompleteOp(uint64_t id, const Status& st);
  // `record_begun`: a protected message's body, in its header's record.
  void StartPayload(uint8_t* dst, uint64_t len, bool record_begun = false);
  // Where the payload's next `len` bytes go: for a put, its region found
  // again (it may have been freed since the last piece) and held while
  // `pinned` lives; else payload_dst_.
  Result<uint8_t*> PayloadPlace(uint64_t len, std::optional<RegionTable::Pinned>* pinned);
  // Pins the regions the get answers among the first `frames` queued read
  // from, and checks each is still there; an error when one is gone.
  Status PinAnswers(size_t frames, std::optional<RegionTable::Pinned>* pinned);
  void UpdateInterest();
  // The peer broke the protocol: logged, then closed.
  void Refuse(const Status& why);
  void MarkDead(const Status& why, bool report);
  Status DeadStatus() const;

  TcpContext* ctx_;
  int fd_;
  std::string peer_;

  // Progress thread only.
  uint64_t token_ = 0;
  bool connecting_ = false;  // outgoing: the socket is not connected yet
  bool greeted_ = false;     // the peer's preamble arrived
  bool closing_ = false;     // Close(): shut down once the queue drains
  bool write_shut_ = false;
  bool want_write_ = false;  // EPOLLOUT asked for
  bool dead_ = false;
  uint64_t reads_ = 0;  // recv calls that returned bytes
  int sending_ = 0;     // inside Queue's write: a failure is reported later (MarkDead)
  Status close_reason_;
  ConnectCallback connect_done_;
  RingQueue<OutFrame> out_;  // keeps its storage: no allocation per frame
  // An entry per put or get: its node from the pool.
  std::unordered_map<uint64_t, Op, std::hash<uint64_t>, std::equal_to<>,
                     PoolAllocator<std::pair<const uint64_t, Op>>>
      ops_;
  uint64_t next_op_ = 1;
  uint64_t ops_issued_ = 0, ops_completed_ = 0;
  RingQueue<std::pair<uint64_t, Completion>> flush_waiters_;
  std::vector<Completion> written_;  // WriteSome's, kept for its capacity

  RecvState state_ = RecvState::kPreamble;
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rbuf_size_;
  size_t rpos_ = 0, rend_ = 0;
  // A header (with its tag when protected), a preamble or a payload's tag.
  std::array<uint8_t, kFrameHeaderBytes + kSealTagBytes> hdr_{};
  size_t hdr_got_ = 0;
  FrameHeader cur_;
  uint8_t* payload_dst_ = nullptr;  // where the current payload goes
  uint64_t payload_left_ = 0;
  // A put's payload goes into this region (id and key as the peer named
  // them), found again for each piece; 0: into this side's own buffer.
  uint32_t payload_region_ = 0;
  RegionKey payload_key_{};
  MessageBytes message_;  // a message larger than what was buffered

  // Protection (ProtectSession): null until then.
  std::shared_ptr<SessionCipher> seal_, open_;  // shared: handed over in a Task
  bool payload_sealed_ = false;                 // the payload being read is a sealed record
  // Sealed bytes on their way to the socket; the completions of the frames
  // wholly in them run once they are sent.
  std::unique_ptr<uint8_t[]> sealed_;
  size_t sealed_pos_ = 0, sealed_end_ = 0;
  std::vector<Completion> sealed_written_;
};

}  // namespace tessera::transport::tcp
