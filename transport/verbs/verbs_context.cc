#include "transport/verbs/verbs_context.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "transport/run_on_loop.h"
#include "transport/sockaddr.h"
#include "transport/verbs/verbs_errors.h"

namespace tessera::transport::verbs {
namespace {

// Set in the work request id of every receive: slots and operations are
// 8-byte aligned, so bit 0 is free to say which one a completion is for.
constexpr uint64_t kReceiveTag = 1;

Status SetNonBlocking(int fd, const char* what) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status::Internal(std::string("making the ") + what +
                            " non-blocking: " + std::strerror(errno));
  }
  return Status::Ok();
}

Status AddToEpoll(int epoll_fd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return Status::Internal(std::string("epoll_ctl: ") + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Context>> VerbsContext::Create(const ContextOptions& options) {
  std::unique_ptr<VerbsContext> ctx(new VerbsContext(options));
  Status st = ctx->Init();
  if (!st.ok()) return st;
  return std::unique_ptr<Context>(std::move(ctx));
}

Status VerbsContext::Init() {
  if (options_.device.empty()) {
    if (const char* dev = std::getenv("TESSERA_VERBS_DEVICE")) options_.device = dev;
  }
  int num = 0;
  ibv_context** list = rdma_get_devices(&num);
  if (list == nullptr || num == 0) {
    if (list) rdma_free_devices(list);
    return Status::Unavailable(
        "verbs backend: no RDMA devices (rdma_get_devices found none); load a driver or "
        "Soft-RoCE (rdma link add rxe0 type rxe netdev IFACE), run `tessera doctor`, or use "
        "--transport ucx");
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  Status st = epoll_fd_ < 0 ? Status::Internal(std::string("epoll_create1: ") + strerror(errno))
                            : Status::Ok();
  for (int i = 0; i < num && st.ok(); ++i) st = OpenDevice(list[i]);
  rdma_free_devices(list);
  if (!st.ok()) return st;
  if (!options_.device.empty() && DeviceByName(options_.device) == nullptr) {
    std::string names;
    for (const auto& d : devices_) names += (names.empty() ? "" : ", ") + d->name;
    return Status::NotFound("verbs backend: no RDMA device named '" + options_.device +
                            "' (this host has " + names + ")");
  }
  cm_channel_ = rdma_create_event_channel();
  if (cm_channel_ == nullptr) {
    return Status::Internal(std::string("rdma_create_event_channel: ") + std::strerror(errno) +
                            " (is rdma_ucm loaded? /dev/infiniband/rdma_cm must exist)");
  }
  TESSERA_RETURN_IF_ERROR(SetNonBlocking(cm_channel_->fd, "rdma_cm event channel"));
  TESSERA_RETURN_IF_ERROR(AddToEpoll(epoll_fd_, cm_channel_->fd));

  EventLoop::Hooks hooks;
  hooks.progress = [this] { return Progress(); };
  hooks.arm = [this] { return Arm(); };
  hooks.event_fd = options_.busy_poll ? -1 : epoll_fd_;
  auto loop = EventLoop::Create(options_.name, options_.busy_poll, std::move(hooks),
                                options_.spin_before_sleep);
  if (!loop.ok()) return loop.status();
  loop_ = std::move(*loop);
  UseLoop(loop_.get());
  loop_->Start();
  std::string names;
  for (const auto& d : devices_) names += (names.empty() ? "" : ", ") + d->name;
  TLOG_DEBUG("{}: verbs backend on {}", options_.name, names);
  return Status::Ok();
}

Status VerbsContext::OpenDevice(ibv_context* verbs) {
  auto dev = std::make_unique<Device>();
  dev->verbs = verbs;
  dev->name = ibv_get_device_name(verbs->device);
  dev->node_guid = ibv_get_device_guid(verbs->device);
  ibv_port_attr port{};
  if (ibv_query_port(verbs, 1, &port) == 0 && port.max_msg_sz > 0) {
    dev->max_msg_size = port.max_msg_sz;
  }
  dev->pd = ibv_alloc_pd(verbs);
  if (dev->pd == nullptr) return Status::Internal(dev->name + ": ibv_alloc_pd failed");
  dev->channel = ibv_create_comp_channel(verbs);
  if (dev->channel == nullptr) {
    return Status::Internal(dev->name + ": ibv_create_comp_channel failed");
  }
  TESSERA_RETURN_IF_ERROR(SetNonBlocking(dev->channel->fd, "completion channel"));
  TESSERA_RETURN_IF_ERROR(AddToEpoll(epoll_fd_, dev->channel->fd));
  ibv_device_attr attr{};
  const bool queried = ibv_query_device(verbs, &attr) == 0;
  const int max_cqe = queried ? attr.max_cqe : 4096;
  dev->qp_bound_windows = queried && (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
  dev->cq = ibv_create_cq(verbs, std::min(max_cqe, 16384), nullptr, dev->channel, 0);
  if (dev->cq == nullptr) return Status::Internal(dev->name + ": ibv_create_cq failed");
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = std::min<uint32_t>(attr.max_srq_wr ? attr.max_srq_wr : 4096, 16384);
  srq_attr.attr.max_sge = 1;
  dev->srq = ibv_create_srq(dev->pd, &srq_attr);
  if (dev->srq == nullptr) {
    return Status::Internal(dev->name + ": ibv_create_srq failed: " + std::strerror(errno));
  }
  dev->srq_capacity = srq_attr.attr.max_wr;
  devices_.push_back(std::move(dev));
  return Status::Ok();
}

Device* VerbsContext::DeviceByName(const std::string& name) {
  for (auto& d : devices_) {
    if (d->name == name) return d.get();
  }
  return nullptr;
}

Device* VerbsContext::DeviceOf(ibv_context* verbs) {
  for (auto& d : devices_) {
    if (d->verbs == verbs) return d.get();
  }
  return nullptr;
}

VerbsContext::~VerbsContext() {
  if (loop_) {
    RunOnLoop(*this, [this] {
      std::vector<std::shared_ptr<VerbsEndpoint>> eps;
      for (auto& [id, ep] : by_id_) eps.push_back(ep);
      for (auto& ep : eps) ep->MarkDead(Status::Aborted("context closing"), /*report=*/false);
      return 0;
    });
    loop_->Stop();
  }
  stopped_ = true;
  // The flushed work requests' completions free their ops and let each
  // endpoint tear down its queue pair; wait for them, within a bound.
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto busy = [this] {
    for (auto& [id, ep] : by_id_) {
      if (ep->outstanding_ > 0) return true;
    }
    return false;
  };
  while (busy() && std::chrono::steady_clock::now() < limit) {
    for (auto& dev : devices_) PollCompletions(*dev);
  }
  for (auto& [id, ep] : by_id_) {
    if (ep->qp_) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }
  by_id_.clear();
  by_qp_.clear();
  if (cm_channel_) rdma_destroy_event_channel(cm_channel_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  // The devices go with the last region (DeviceSet).
}

DeviceSet::~DeviceSet() {
  for (auto& dev : devices) {
    if (dev->cq_events_unacked > 0) ibv_ack_cq_events(dev->cq, dev->cq_events_unacked);
    if (dev->srq) ibv_destroy_srq(dev->srq);
    for (auto& c : dev->recv_chunks) ibv_dereg_mr(c.mr);
    for (auto& c : dev->send_chunks) ibv_dereg_mr(c.mr);
    if (dev->cq) ibv_destroy_cq(dev->cq);
    if (dev->channel) ibv_destroy_comp_channel(dev->channel);
    if (dev->pd) ibv_dealloc_pd(dev->pd);
  }
}

void VerbsContext::SetHandler(uint16_t msg_id, MessageHandler handler) {
  handlers_.Set(msg_id, std::move(handler));
}

void VerbsContext::SetDisconnectHandler(DisconnectHandler handler) {
  on_disconnect_ = std::move(handler);
}

Status VerbsContext::SetUpQp(VerbsEndpoint& ep, rdma_cm_id* id) {
  Device* dev = DeviceOf(id->verbs);
  if (dev == nullptr) {
    return Status::Internal("rdma_cm chose a device this context did not open");
  }
  if (!options_.device.empty() && dev->name != options_.device) {
    return Status::FailedPrecondition("the route to " + ep.peer_ + " goes through " + dev->name +
                                      ", not the requested " + options_.device +
                                      "; use an address on " + options_.device + "'s interface");
  }
  if (!dev->announced) {
    // Every automatic choice is said once.
    dev->announced = true;
    TLOG_INFO("{}: verbs connections to {} use {} port {} (rdma_cm's choice for the route{})",
              options_.name, ep.peer_, dev->name, static_cast<int>(id->port_num),
              options_.device.empty() ? "" : ", as requested");
  }
  TESSERA_RETURN_IF_ERROR(GrowReceives(*dev, kCredits + kSpareSlots));
  ibv_qp_init_attr attr{};
  attr.send_cq = dev->cq;
  attr.recv_cq = dev->cq;
  attr.srq = dev->srq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = kSendQueueDepth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_wr = 0;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, dev->pd, &attr) != 0) {
    return Status::ResourceExhausted("creating a queue pair on " + dev->name + ": " +
                                     std::strerror(errno));
  }
  ep.dev_ = dev;
  ep.qp_ = id->qp;
  ep.sq_free_ = kSendQueueDepth;
  by_qp_[id->qp->qp_num] = ep.shared_from_this();
  return Status::Ok();
}

Status VerbsContext::GrowReceives(Device& dev, uint32_t slots) {
  if (dev.recv_posted + slots > dev.srq_capacity) {
    return Status::ResourceExhausted(dev.name + ": the shared receive queue is full (" +
                                     std::to_string(dev.srq_capacity) + " buffers)");
  }
  Device::Chunk chunk;
  const size_t bytes = static_cast<size_t>(slots) * kSlotBytes;
  chunk.memory.reset(new uint8_t[bytes]);
  chunk.mr = ibv_reg_mr(dev.pd, chunk.memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE);
  if (chunk.mr == nullptr) return RegistrationError(errno, bytes, "receive buffers");
  chunk.slots.reserve(slots);
  for (uint32_t i = 0; i < slots; ++i) {
    chunk.slots.push_back(
        {chunk.memory.get() + static_cast<size_t>(i) * kSlotBytes, chunk.mr->lkey});
  }
  for (auto& slot : chunk.slots) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(slot.data), kSlotBytes, slot.lkey};
    ibv_recv_wr wr{};
    wr.wr_id = reinterpret_cast<uintptr_t>(&slot) | kReceiveTag;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_srq_recv(dev.srq, &wr, &bad) != 0) {
      return Status::Internal(dev.name + ": ibv_post_srq_recv failed");
    }
  }
  dev.recv_posted += slots;
  dev.recv_chunks.push_back(std::move(chunk));
  return Status::Ok();
}

Device::Slot* VerbsContext::TakeSendSlot(Device& dev) {
  if (dev.free_send_slots.empty()) {
    constexpr uint32_t kGrow = 64;
    Device::Chunk chunk;
    const size_t bytes = static_cast<size_t>(kGrow) * kSlotBytes;
    chunk.memory.reset(new uint8_t[bytes]);
    chunk.mr = ibv_reg_mr(dev.pd, chunk.memory.get(), bytes, IBV_ACCESS_LOCAL_WRITE);
    if (chunk.mr == nullptr) return nullptr;
    for (uint32_t i = 0; i < kGrow; ++i) {
      chunk.slots.push_back(
          {chunk.memory.get() + static_cast<size_t>(i) * kSlotBytes, chunk.mr->lkey});
    }
    for (auto& s : chunk.slots) dev.free_send_slots.push_back(&s);
    dev.send_chunks.push_back(std::move(chunk));
  }
  Device::Slot* slot = dev.free_send_slots.back();
  dev.free_send_slots.pop_back();
  return slot;
}

// ---------------------------------------------------------------------------
// Progress

bool VerbsContext::Progress() {
  bool worked = false;
  for (auto& dev : devices_) {
    // Consume completion-channel events (the CQ is polled below either way).
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (ibv_get_cq_event(dev->channel, &cq, &cq_ctx) == 0) {
      if (++dev->cq_events_unacked >= 64) {
        ibv_ack_cq_events(dev->cq, dev->cq_events_unacked);
        dev->cq_events_unacked = 0;
      }
    }
    worked |= PollCompletions(*dev);
  }
  worked |= PollCmEvents();
  return worked;
}

bool VerbsContext::Arm() {
  for (auto& dev : devices_) {
    if (ibv_req_notify_cq(dev->cq, 0) != 0) return false;
    // A completion that arrived before arming raises no event: look once more.
    if (PollCompletions(*dev)) return false;
  }
  return true;
}

bool VerbsContext::PollCompletions(Device& dev) {
  ibv_wc wcs[32];
  const int n = ibv_poll_cq(dev.cq, 32, wcs);
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    // Told apart by the tag, not by wc.opcode, which a failed completion
    // (a receive cut short when its QP was torn down) leaves undefined.
    if (wc.wr_id & kReceiveTag) {
      auto* slot = reinterpret_cast<Device::Slot*>(wc.wr_id & ~kReceiveTag);
      auto it = by_qp_.find(wc.qp_num);
      if (wc.status == IBV_WC_SUCCESS && it != by_qp_.end()) {
        std::shared_ptr<VerbsEndpoint> ep = it->second;
        ep->OnReceive(slot->data, wc.byte_len);
      }
      // Back to the SRQ at once: credits count buffers, not messages handled.
      ibv_sge sge{reinterpret_cast<uintptr_t>(slot->data), kSlotBytes, slot->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = wc.wr_id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_srq_recv(dev.srq, &wr, &bad) != 0) {
        TLOG_ERROR("{}: reposting a receive buffer failed", options_.name);
      }
      continue;
    }
    auto* op = reinterpret_cast<VerbsEndpoint::Op*>(wc.wr_id);
    std::shared_ptr<VerbsEndpoint> keep = op->ep->shared_from_this();
    op->ep->OnCompletion(wc, op);
  }
  return n > 0;
}

void VerbsContext::Dispatch(const std::shared_ptr<VerbsEndpoint>& ep, uint16_t msg_id,
                            std::span<const uint8_t> bytes) {
  counters_.messages_received++;
  counters_.message_bytes_received += bytes.size();
  handlers_.Dispatch(ep, msg_id, bytes);
}

Counters VerbsContext::counters() const {
  Counters c = counters_.Snapshot();
  AddLoopCounters(c);
  return c;
}

std::string VerbsContext::Describe() const {
  std::string names;
  for (const auto& d : devices_) names += (names.empty() ? "" : ", ") + d->name;
  return "verbs (rdma-core; devices " + names + ", " +
         (options_.busy_poll ? "busy-poll" : "sleeping progress") + ")";
}

}  // namespace tessera::transport::verbs
