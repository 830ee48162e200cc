// The verbs backend: libibverbs RC queue pairs connected through rdma_cm.
//
// - Control messages are SENDs into a shared receive queue (one per device)
//   of registered buffers. A message larger than a buffer travels in
//   fragments, reassembled in order (RC delivers in order). Credits keep a
//   sender from overrunning the peer's buffers: each connection is granted
//   kCredits buffers, returned in the header of every fragment going the
//   other way, or by a credit-only fragment when nothing else is sent.
// - Data moves one-sided: RDMA WRITE for puts, RDMA READ for gets, between
//   registered regions and local buffers (registered regions are looked up;
//   other local memory is registered for the one operation).
// - Progress: one completion queue and completion channel per device, and the
//   rdma_cm event channel, all in one epoll set that the EventLoop sleeps on.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "transport/atomic_counters.h"
#include "transport/event_loop.h"
#include "transport/loop_context.h"
#include "transport/message_handlers.h"
#include "transport/transport.h"

namespace tessera::transport::verbs {

class VerbsContext;
class VerbsEndpoint;

// Fragment header, at the start of every SEND.
struct FragmentHeader {
  uint16_t msg_id;
  uint8_t flags;  // kFirst | kLast | kCreditOnly
  uint8_t reserved;
  uint32_t credits;    // receive buffers the sender freed for the receiver
  uint32_t total_len;  // whole message (first fragment)
  uint32_t frag_len;   // payload bytes in this fragment
};
static_assert(sizeof(FragmentHeader) == 16);

// What travels in rdma_cm's private data on connect and accept.
struct ConnectPrivateData {
  uint32_t magic;  // kConnectMagic
  uint16_t version;
  uint16_t credits;    // receive buffers granted to the peer
  uint64_t node_guid;  // the device this end's QP is on (for picking rkeys)
};

// One RDMA device as librdmacm opened it, and what Tessera keeps on it.
struct Device {
  ibv_context* verbs = nullptr;
  std::string name;
  uint64_t node_guid = 0;
  uint32_t max_msg_size = 1u << 30;
  // Type-2B memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B): a window bound
  // to one queue pair takes remote accesses from that queue pair only.
  bool qp_bound_windows = false;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_srq* srq = nullptr;
  int cq_events_unacked = 0;
  // Receive buffers (posted to the SRQ) and send buffers, in registered
  // chunks that grow as connections come.
  struct Slot {
    uint8_t* data;
    uint32_t lkey;
  };
  struct Chunk {
    std::unique_ptr<uint8_t[]> memory;
    ibv_mr* mr = nullptr;
    std::vector<Slot> slots;
  };
  std::vector<Chunk> recv_chunks, send_chunks;
  std::vector<Slot*> free_send_slots;
  uint32_t srq_capacity = 0;
  bool announced = false;  // its first connection was logged
  uint32_t recv_posted = 0;
};

class VerbsRegion;

// The devices and the registered regions on them. Shared by the context and
// its regions: a region may outlive its context (its memory registration
// then keeps the protection domain alive until it goes).
struct DeviceSet {
  ~DeviceSet();
  std::vector<std::unique_ptr<Device>> devices;  // fixed after the context's Init
  // Registered regions by base address, for FindLkey; any thread.
  std::mutex regions_mu;
  std::map<uintptr_t, VerbsRegion*> regions;
};

// Registers GPU memory on `dev`: a dmabuf export (ibv_reg_dmabuf_mr), else
// ibv_reg_mr where a peer-memory module is loaded; else an error naming both.
Result<ibv_mr*> RegisterGpuMemory(const Device& dev, void* data, size_t size, int flags);

class VerbsContext final : public LoopContext {
 public:
  // Fragment buffers and credits: 32 buffers of 16 KiB per connection.
  static constexpr uint32_t kSlotBytes = 16 * 1024;
  static constexpr uint32_t kCredits = 32;
  // Buffers beyond the credits for credit-only fragments in flight.
  static constexpr uint32_t kSpareSlots = 4;
  static constexpr uint32_t kSendQueueDepth = 256;

  static Result<std::unique_ptr<Context>> Create(const ContextOptions& options);
  ~VerbsContext() override;

  Status CanRegister(MemoryKind kind) const override;
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
  friend class VerbsEndpoint;
  friend class VerbsListener;
  friend class VerbsRegion;

  explicit VerbsContext(ContextOptions options) : options_(std::move(options)) {}
  Status Init();
  Status OpenDevice(ibv_context* verbs);
  Device* DeviceOf(ibv_context* verbs);
  Device* DeviceByName(const std::string& name);
  Result<std::unique_ptr<Region>> MapRegion(void* data, size_t size, MemoryKind kind,
                                            RemoteAccess access, bool owned);

  // Progress-thread side.
  bool Progress();
  bool Arm();
  bool PollCompletions(Device& dev);
  bool PollCmEvents();
  void OnCmEvent(rdma_cm_event* event);
  void OnConnectRequest(rdma_cm_event* event);
  Status SetUpQp(VerbsEndpoint& ep, rdma_cm_id* id);
  Status GrowReceives(Device& dev, uint32_t slots);
  Device::Slot* TakeSendSlot(Device& dev);
  void Dispatch(const std::shared_ptr<VerbsEndpoint>& ep, uint16_t msg_id,
                std::span<const uint8_t> bytes);
  // Local memory for a one-sided operation: the lkey of a registered region
  // holding it, or 0 when there is none (the caller registers it).
  uint32_t FindLkey(const Device& dev, const void* data, size_t len) const;

  ContextOptions options_;
  std::unique_ptr<EventLoop> loop_;
  bool stopped_ = false;  // the loop has stopped: the destructor tears down
  rdma_event_channel* cm_channel_ = nullptr;
  int epoll_fd_ = -1;
  std::shared_ptr<DeviceSet> devs_ = std::make_shared<DeviceSet>();
  std::vector<std::unique_ptr<Device>>& devices_ = devs_->devices;

  AtomicCounters counters_;

  // Set before connections exist, then only read.
  MessageHandlers handlers_{options_.name};
  DisconnectHandler on_disconnect_;

  // Progress thread only.
  std::unordered_map<rdma_cm_id*, std::shared_ptr<VerbsEndpoint>> by_id_;
  std::unordered_map<uint32_t, std::shared_ptr<VerbsEndpoint>> by_qp_;
  std::unordered_map<rdma_cm_id*, AcceptHandler> listeners_;
};

class VerbsEndpoint final : public Endpoint, public std::enable_shared_from_this<VerbsEndpoint> {
 public:
  VerbsEndpoint(VerbsContext* ctx, std::string peer, const ContextOptions& options)
      : Endpoint(options), ctx_(ctx), peer_(std::move(peer)) {}
  ~VerbsEndpoint() override = default;

  void Send(uint16_t msg_id, MessageBytes bytes, Completion done) override;
  Result<std::unique_ptr<RemoteRegion>> Attach(std::span<const uint8_t> description) override;
  void Put(const void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Flush(Completion done) override;
  // A put or get with memory no region covers registers it for that one
  // operation (PostRma), which costs far more than copying a small chunk.
  size_t GatherUpTo() const override { return 16u << 10; }
  // The device this connection runs on, once connected.
  Result<const Device*> device();
  // Binds `window` (type 2, on this connection's device) to `mr`'s
  // [addr, addr + len) for remote writes through this queue pair only, and
  // returns the rkey that opens it. The bind goes ahead of any message
  // posted after it, so a peer told the key finds it bound; a bind that
  // fails ends the connection.
  Result<uint32_t> BindWindow(ibv_mw* window, ibv_mr* mr, void* addr, size_t len);
  void Close() override { CloseWith(/*force=*/false); }
  void Abort() override { CloseWith(/*force=*/true); }
  std::string peer() const override { return peer_; }
  std::string DescribeLanes() override;

 private:
  friend class VerbsContext;

  // A work request's context until its completion.
  struct Op {
    enum Kind : uint8_t { kSend, kWrite, kRead, kBind } kind;
    VerbsEndpoint* ep;
    Device::Slot* slot = nullptr;  // kSend: the send buffer
    ibv_mr* temp_mr = nullptr;     // memory registered for this operation
    Completion done;               // the last piece of a message or RMA
    uint64_t rma_seq = 0;          // kWrite/kRead: for Flush
    std::shared_ptr<int> pieces;   // RMA split by max_msg_size: pieces left
    std::shared_ptr<Status> first_error;
  };
  // Work waiting for credits or send-queue room, in issue order.
  struct Pending {
    bool is_message = false;
    // Message
    uint16_t msg_id = 0;
    MessageBytes bytes;
    size_t sent = 0;
    bool credit_only = false;
    // RMA
    Op::Kind rma = Op::kWrite;
    void* local = nullptr;
    size_t len = 0;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint64_t rma_seq = 0;
    Completion done;
  };

  void SendNow(uint16_t msg_id, MessageBytes bytes, Completion done);
  void RmaNow(Op::Kind kind, void* local, size_t len, const RemoteRegion& remote,
              uint64_t remote_addr, Completion done);
  void FlushNow(Completion done);
  // Posts what is pending while credits and send-queue room last.
  void Pump();
  bool PostFragment(Pending& msg);
  bool PostRma(Pending& rma);
  void OnCompletion(const ibv_wc& wc, Op* op);
  void OnReceive(const uint8_t* data, uint32_t len);
  void ReturnCreditsIfDue();
  void FailPending(const Status& why);
  void CloseWith(bool force);
  // Gone: fail what is pending, report (unless we closed it), tear down once
  // the queue pair has no work requests left.
  void MarkDead(const Status& why, bool report);
  void MaybeDestroy();
  Status DeadStatus() const;

  VerbsContext* ctx_;
  std::string peer_;
  std::atomic<bool> alive_{false};

  // Progress thread only.
  rdma_cm_id* id_ = nullptr;
  Device* dev_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint64_t remote_guid_ = 0;
  bool announced_ = false;  // connect_done_ / accept handler called
  bool passive_ = false;    // accepted from a listener
  bool closing_ = false;    // graceful close requested: disconnect when drained
  bool dead_ = false;
  bool reported_ = false;
  Status close_reason_;
  ConnectCallback connect_done_;
  AcceptHandler on_accept_;
  uint32_t send_credits_ = 0;
  uint32_t credits_to_return_ = 0;
  uint32_t sq_free_ = VerbsContext::kSendQueueDepth;
  uint32_t outstanding_ = 0;  // work requests posted and not completed
  std::deque<Pending> pending_;
  MessageBytes inbox_;  // the message being reassembled
  uint16_t inbox_msg_ = 0;
  uint32_t inbox_total_ = 0;
  bool inbox_open_ = false;
  uint64_t rma_issued_ = 0, rma_completed_ = 0;
  std::vector<std::pair<uint64_t, Completion>> flush_waiters_;
};

// The rkey of `remote` when it was attached to `ep` and holds [addr, +len).
Result<uint32_t> RemoteKeyFor(const VerbsEndpoint* ep, const RemoteRegion& remote, uint64_t addr,
                              size_t len, const std::string& peer);

}  // namespace tessera::transport::verbs
