#include "transport/ucx/ucx_context.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>

#include "core/log.h"
#include "gpu/cuda.h"
#include "transport/region_desc.h"
#include "transport/run_on_loop.h"
#include "transport/sockaddr.h"
#include "transport/ucx/ucx_errors.h"
#include "transport/ucx/ucx_library.h"
#include "transport/ucx/ucx_tcp_policy.h"

namespace tessera::transport::ucx {
namespace {

// UCX 1.13's shared-memory transports (posix, sysv) cannot report peer
// failure, so an endpoint that asks for it never uses them. Same-host peers
// therefore skip it in auto mode; their loss is still seen through the
// connection manager's socket (and, later, heartbeats).
ucp_err_handling_mode_t ErrorModeFor(PeerFailureMode mode, const sockaddr_storage& peer) {
  switch (mode) {
    case PeerFailureMode::kAlways:
      return UCP_ERR_HANDLING_MODE_PEER;
    case PeerFailureMode::kNever:
      return UCP_ERR_HANDLING_MODE_NONE;
    case PeerFailureMode::kAuto:
      break;
  }
  return IsLocalAddress(peer) ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
}

}  // namespace

class UcxListener final : public Listener {
 public:
  UcxListener(UcxContext* ctx, AcceptHandler on_accept)
      : ctx_(ctx), on_accept_(std::move(on_accept)) {}
  ~UcxListener() override {
    RunOnLoop(*ctx_, [this] {
      if (listener_) ucp_listener_destroy(listener_);
      ctx_->closed_since_progress_ = true;
      return 0;
    });
  }
  uint16_t port() const override { return port_; }

  static void OnConnRequest(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<UcxListener*>(arg);
    UcxContext* ctx = self->ctx_;
    std::string peer = "unknown peer";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      peer = SockaddrToString(attr.client_address);
    } else {
      attr.client_address = sockaddr_storage{};  // unknown: treated as remote
    }

    auto ep = std::make_shared<UcxEndpoint>(ctx, peer, ctx->options_);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.conn_request = request;
    params.err_mode = ErrorModeFor(ctx->options_.peer_failure, attr.client_address);
    Status st = ctx->CreateEndpoint(params, ep);
    if (!st.ok()) {
      TLOG_WARN("{}: refusing connection from {}: {}", ctx->options_.name, peer, st.ToString());
      return;
    }
    // Accepted once its handshake message arrives (UcxContext::Dispatch).
    ep->on_accept_ = self->on_accept_;
  }

  UcxContext* ctx_;
  AcceptHandler on_accept_;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
};

// ---------------------------------------------------------------------------
// UcxContext

Result<std::unique_ptr<Context>> UcxContext::Create(const ContextOptions& options) {
  std::unique_ptr<UcxContext> ctx(new UcxContext(options));
  TESSERA_RETURN_IF_ERROR(ctx->Init());
  return std::unique_ptr<Context>(std::move(ctx));
}

Status UcxContext::Init() {
  ApplyUcxDefaults();
  if (UcxAsyncGuard::Needed()) {
    async_guard_ = std::make_unique<UcxAsyncGuard>([this] {
      if (closed_since_progress_ && !in_progress_ && worker_ != nullptr) Progress();
    });
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
  // UCX's tcp on loopback devices (and RDMA ports) only, unless allowed.
  auto devices = UcxNetDevicesForTcpPolicy();
  if (devices.ok() && !devices->empty()) {
    st = ucp_config_modify(config, "NET_DEVICES", devices->c_str());
    if (st != UCS_OK) devices = FromUcs(st, "ucp_config_modify(NET_DEVICES=" + *devices + ")");
    TLOG_DEBUG("{}: UCX's tcp may open only these devices: {}", options_.name, *devices);
  }
  if (!devices.ok()) {
    ucp_config_release(config);
    return devices.status();
  }

  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  // Registration and key packing may be called from user threads.
  params.mt_workers_shared = 1;
  params.name = options_.name.c_str();
  context_ = std::make_shared<UcpContextHolder>();
  st = ucp_init(&params, config, &context_->handle);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");
  memory_types_ = QueryMemoryTypes(context_->handle);

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time: the progress thread, or a thread driving in its
  // place, under the event loop's drive lock.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  // A new worker opens sockets (its interfaces') the moment it is created.
  Opening([&] { st = ucp_worker_create(context_->handle, &wparams, &worker_); });
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  am.id = kAmId;
  am.cb = &UcxContext::AmCallback;
  am.arg = this;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  st = ucp_worker_set_am_recv_handler(worker_, &am);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");

  int efd = -1;
  if (!options_.busy_poll) {
    st = ucp_worker_get_efd(worker_, &efd);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_efd");
  }
  EventLoop::Hooks hooks;
  hooks.progress = [this] { return Progress(); };
  hooks.guard = async_guard_.get();
  hooks.arm = [this] { return ucp_worker_arm(worker_) == UCS_OK; };
  hooks.event_fd = efd;
  if (MissesRcWakeups()) {
    // UCX before 1.15 can miss the event that should wake a sleeping worker
    // on its RC (InfiniBand/RoCE) transports (fixed upstream by
    // openucx/ucx#8959): measured on Soft-RoCE, an active message then sat
    // unseen for 10 s and more. Bound every sleep instead.
    hooks.max_sleep_ms = 1;
    TLOG_DEBUG("{}: UCX {} may miss RC wake-ups; the progress thread wakes every 1 ms when idle",
               options_.name, ucp_get_version_string());
  }
  auto spin = options_.spin_before_sleep;
  if (const char* us = std::getenv("TESSERA_PROGRESS_SPIN_US")) {  // for measuring its effect
    spin = std::chrono::microseconds(std::atoll(us));
  }
  auto loop = EventLoop::Create(options_.name, options_.busy_poll, std::move(hooks), spin);
  if (!loop.ok()) return loop.status();
  loop_ = std::move(*loop);
  UseLoop(loop_.get());
  loop_->Start();
  return Status::Ok();
}

UcxContext::~UcxContext() {
  if (loop_) {
    RunOnLoop(*this, [this] {
      std::vector<UcxEndpoint*> eps;
      for (auto& [handle, ep] : endpoints_) eps.push_back(ep.get());
      // Gracefully: a forced close of an endpoint whose lanes are still
      // wiring up leaves its queued sends behind, and UCX 1.13 then aborts
      // in ucp_worker_destroy ("pending request ... should have been
      // flushed"). A peer that never answers costs the bound below.
      for (UcxEndpoint* ep : eps) CloseEndpoint(ep, /*force=*/false);
      return 0;
    });
    loop_->Stop();
  }
  if (worker_) {
    // Let closes finish (graceful ones need the peer's answer), within a bound.
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!closing_.empty() && std::chrono::steady_clock::now() < limit) {
      if (async_guard_) async_guard_->Enter(/*wait=*/true);
      Progress();
      if (async_guard_) async_guard_->Leave();
      std::erase_if(closing_, [](void* req) {
        if (ucp_request_check_status(req) == UCS_INPROGRESS) return false;
        ucp_request_free(req);
        return true;
      });
    }
    if (async_guard_) async_guard_->Enter(/*wait=*/true);
    ucp_worker_destroy(worker_);  // its queue of events goes with it
    worker_ = nullptr;
    if (async_guard_) async_guard_->Leave();
  }
}

bool UcxContext::Progress() {
  in_progress_ = true;
  const bool worked = ucp_worker_progress(worker_) != 0;
  in_progress_ = false;
  closed_since_progress_ = false;  // that call drained what a close left behind
  return worked;
}

void UcxContext::Opening(const std::function<void()>& open) {
  // Inside progress (a connection request answered) the worker cannot be
  // settled; a server's endpoint takes the socket UCX accepted anyway.
  if (async_guard_ == nullptr || in_progress_) return open();
  async_guard_->Exclusively(open);
}

Status UcxContext::CanRegister(MemoryKind kind) const {
  if (kind == MemoryKind::kHost) return Status::Ok();
  if ((memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) == 0 && UcxHasCudaModule()) {
    Status gpu_st = gpu::Available();
    return Status::Unimplemented(
        std::string("UCX backend: this UCX cannot register GPU memory here: UCX ") +
        ucp_get_version_string() + " from " + UcxLibraryPath() +
        " has CUDA modules, but its memory types are " + MemoryTypeNames(memory_types_) + " (" +
        (gpu_st.ok() ? "CUDA answers, so UCX_TLS may leave out cuda_copy" : gpu_st.message()) +
        ")");
  }
  if ((memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) == 0) {
    return Status::Unimplemented(
        std::string("UCX backend: this UCX cannot register GPU memory: UCX ") +
        ucp_get_version_string() + " from " + UcxLibraryPath() + " was built without CUDA (its " +
        "memory types: " + MemoryTypeNames(memory_types_) +
        "); build Tessera against a CUDA-capable UCX (meson -Ducx_prefix=..., e.g. PyPI's "
        "libucx-cu12: see docs/gpu.md)");
  }
  return gpu::Available();
}

Result<std::unique_ptr<Region>> UcxContext::Allocate(size_t size, MemoryKind kind,
                                                     RemoteAccess access) {
  if (kind == MemoryKind::kHost) return Map(nullptr, size, kind, access, /*allocate=*/true);
  if (Status st = CanRegister(kind); !st.ok()) return st;
  // Plain cudaMalloc (never managed memory), registered like the caller's own.
  auto buffer = gpu::DeviceBuffer::AllocateOnCurrentDevice(size);
  if (!buffer.ok()) return buffer.status();
  auto region = Map(buffer->data(), size, kind, access, /*allocate=*/false);
  if (!region.ok()) return region.status();
  static_cast<UcxRegion*>(region->get())->AdoptGpuBuffer(std::move(*buffer));
  return region;
}

Result<std::unique_ptr<Region>> UcxContext::Register(void* data, size_t size, MemoryKind kind,
                                                     RemoteAccess access) {
  if (data == nullptr) return Status::InvalidArgument("register: null buffer");
  return Map(data, size, kind, access, /*allocate=*/false);
}

Result<std::unique_ptr<Region>> UcxContext::Map(void* data, size_t size, MemoryKind kind,
                                                RemoteAccess access, bool allocate) {
  if (Status st = CanRegister(kind); !st.ok()) return st;
  if (size == 0) return Status::InvalidArgument("cannot map an empty region");
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_PROT;
  params.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
  if (static_cast<uint8_t>(access) & static_cast<uint8_t>(RemoteAccess::kRead)) {
    params.prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
  }
  if (static_cast<uint8_t>(access) & static_cast<uint8_t>(RemoteAccess::kWrite)) {
    params.prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
  }
  params.address = data;
  params.length = size;
  params.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  if (kind == MemoryKind::kCuda) {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_->handle, &params, &memh);
  if (st != UCS_OK) {
    return FromUcs(st, std::string(allocate ? "allocating " : "registering ") +
                           std::to_string(size) + " bytes");
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(memh, &attr);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_->handle, memh);
    return FromUcs(st, "ucp_mem_query");
  }
  void* rkey_buf = nullptr;
  size_t rkey_len = 0;
  st = ucp_rkey_pack(context_->handle, memh, &rkey_buf, &rkey_len);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_->handle, memh);
    return FromUcs(st, "ucp_rkey_pack");
  }
  void* base = allocate ? attr.address : data;
  auto desc = EncodeRegionDesc(BackendId::kUcx, reinterpret_cast<uint64_t>(base), size,
                               {static_cast<const uint8_t*>(rkey_buf), rkey_len});
  ucp_rkey_buffer_release(rkey_buf);
  return std::unique_ptr<Region>(
      new UcxRegion(context_, memh, base, size, kind, std::move(desc), gpu::DeviceBuffer{}));
}

void UcxContext::SetHandler(uint16_t msg_id, MessageHandler handler) {
  handlers_.Set(msg_id, std::move(handler));
}

void UcxContext::SetDisconnectHandler(DisconnectHandler handler) {
  on_disconnect_ = std::move(handler);
}

Result<std::unique_ptr<Listener>> UcxContext::Listen(const std::string& host, uint16_t port,
                                                     AcceptHandler on_accept) {
  auto listener = std::make_unique<UcxListener>(this, std::move(on_accept));
  auto addr = Resolve(host.empty() ? "0.0.0.0" : host, port);
  if (!addr.ok()) return addr.status();
  TESSERA_RETURN_IF_ERROR(
      CheckUcxTcpAllowed(*addr, "listening on " + host + ":" + std::to_string(port)));
  Status st = RunOnLoop(*this, [&]() -> Status {
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    params.sockaddr.addrlen = SockaddrLen(*addr);
    params.conn_handler.cb = &UcxListener::OnConnRequest;
    params.conn_handler.arg = listener.get();
    ucs_status_t s = UCS_OK;
    Opening([&] { s = ucp_listener_create(worker_, &params, &listener->listener_); });
    if (s == UCS_ERR_BUSY) {
      // UCX says "Device is busy" for an address in use.
      return Status::Unavailable("listen on " + host + ":" + std::to_string(port) +
                                 ": the port is in use by another process");
    }
    if (s != UCS_OK) return FromUcs(s, "listen on " + host + ":" + std::to_string(port));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = ucp_listener_query(listener->listener_, &attr);
    if (s != UCS_OK) return FromUcs(s, "ucp_listener_query");
    listener->port_ = attr.sockaddr.ss_family == AF_INET
                          ? ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port)
                          : ntohs(reinterpret_cast<sockaddr_in6*>(&attr.sockaddr)->sin6_port);
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return std::unique_ptr<Listener>(std::move(listener));
}

void UcxContext::Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                         ConnectCallback done) {
  std::string peer = host + ":" + std::to_string(port);
  Post([this, host, port, timeout, peer, done = std::move(done)]() mutable {
    auto addr = Resolve(host, port);
    if (!addr.ok()) {
      done(addr.status());
      return;
    }
    if (Status allowed = CheckUcxTcpAllowed(*addr, "connecting to " + peer); !allowed.ok()) {
      done(allowed);
      return;
    }
    auto ep = std::make_shared<UcxEndpoint>(this, peer, options_);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    params.sockaddr.addrlen = SockaddrLen(*addr);
    params.err_mode = ErrorModeFor(options_.peer_failure, *addr);
    Status st;
    Opening([&] { st = CreateEndpoint(params, ep); });
    if (!st.ok()) {
      done(st.WithContext("connect to " + peer));
      return;
    }
    ep->connect_done_ = std::move(done);
    ep->SendNow(kConnectMsg, {}, {});
    std::weak_ptr<UcxEndpoint> weak = ep;
    PostAfter(timeout, [this, weak, peer, timeout] {
      auto pending = weak.lock();
      if (!pending || !pending->connect_done_) return;
      auto cb = std::move(pending->connect_done_);
      pending->connect_done_ = nullptr;
      CloseEndpoint(pending.get(), /*force=*/true);
      cb(Status::DeadlineExceeded("connect to " + peer + ": no answer within " +
                                  std::to_string(timeout.count()) + " ms"));
    });
  });
}

Status UcxContext::CreateEndpoint(const ucp_ep_params_t& in,
                                  const std::shared_ptr<UcxEndpoint>& ep) {
  ucp_ep_params_t params = in;
  // The callback finds the endpoint by its ucp_ep_h: UCX may still report an
  // error for an endpoint we already closed and freed.
  params.err_handler.cb = &UcxContext::EndpointErrorCallback;
  params.err_handler.arg = this;
  ucs_status_t st = ucp_ep_create(worker_, &params, &ep->ep_);
  if (st != UCS_OK) return FromUcs(st, "ucp_ep_create");
  endpoints_[ep->ep_] = ep;
  return Status::Ok();
}

void UcxContext::EndpointErrorCallback(void* arg, ucp_ep_h handle, ucs_status_t status) {
  static_cast<UcxContext*>(arg)->OnEndpointError(handle, status);
}

void UcxContext::OnEndpointError(ucp_ep_h handle, ucs_status_t status) {
  auto it = endpoints_.find(handle);
  if (it == endpoints_.end()) return;  // closed by us already
  std::shared_ptr<UcxEndpoint> ep = it->second;
  const Status why = FromUcs(status, "connection to " + ep->peer_ + " failed");
  ep->close_reason_ = why;
  CloseEndpoint(ep.get(), /*force=*/true);
  if (ep->connect_done_) {
    auto cb = std::move(ep->connect_done_);
    ep->connect_done_ = nullptr;
    cb(why);
    return;
  }
  if (ep->connected_ && on_disconnect_) on_disconnect_(ep, why);
}

void UcxContext::CloseEndpoint(UcxEndpoint* ep, bool force) {
  if (ep->ep_ == nullptr) return;
  if (ep->close_reason_.ok())
    ep->close_reason_ = Status::Unavailable("connection to " + ep->peer_ + " closed");
  ucp_ep_h handle = ep->ep_;
  ep->ep_ = nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(handle, &param);
  closed_since_progress_ = true;
  if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
  std::erase_if(closing_, [](void* r) {
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
    ucp_request_free(r);
    return true;
  });
  auto node = endpoints_.extract(handle);
  // Drop the map's reference after the caller is done with the endpoint.
  if (!node.empty()) Post([keep = std::move(node.mapped())] {});
}

ucs_status_t UcxContext::AmCallback(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxContext*>(arg);
  if (header_length != 2 || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    TLOG_WARN("{}: dropping a message without a Tessera header", self->options_.name);
    return UCS_OK;
  }
  const auto* h = static_cast<const uint8_t*>(header);
  uint16_t msg_id = static_cast<uint16_t>(h[0] | (h[1] << 8));
  ucp_ep_h reply_ep = param->reply_ep;
  auto it = self->endpoints_.find(reply_ep);
  if (it == self->endpoints_.end()) {
    TLOG_WARN("{}: a {}-byte message from an unknown endpoint dropped", self->options_.name,
              length);
    return UCS_OK;  // a rendezvous not received is released by UCX
  }
  if (length > it->second->message_limit()) {
    // Refused before a byte is allocated for it (UCX holds an eager message
    // in its own buffers; a rendezvous one is only announced).
    TLOG_WARN("{}: {} announced a {}-byte message, over the {}-byte limit{}; closing",
              self->options_.name, it->second->peer(), length, it->second->message_limit(),
              it->second->message_limit() < self->options_.max_message_bytes
                  ? " before authentication"
                  : "");
    self->Post([ep = it->second] { ep->Abort(); });
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    self->OnAmReceived(reply_ep, msg_id, {static_cast<const uint8_t*>(data), length});
    return UCS_OK;
  }
  // Large message: fetch it into a buffer of our own, then dispatch. Its
  // announcement already shows that the peer is alive.
  it->second->NoteTraffic();
  // Per message (UCX 1.22 sends a batched push this way), so from the pool.
  struct RndvRecv : Pooled {
    RndvRecv(UcxContext* c, ucp_ep_h ep, uint16_t id, size_t n)
        : ctx(c), reply_ep(ep), msg_id(id), buffer(n) {}
    UcxContext* ctx;
    ucp_ep_h reply_ep;
    uint16_t msg_id;
    MessageBytes buffer;
  };
  auto* recv = new RndvRecv(self, reply_ep, msg_id, length);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.user_data = recv;
  rp.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    auto* r = static_cast<RndvRecv*>(user_data);
    if (status == UCS_OK) r->ctx->OnAmReceived(r->reply_ep, r->msg_id, r->buffer);
    delete r;
    ucp_request_free(request);
  };
  ucs_status_ptr_t sp = ucp_am_recv_data_nbx(self->worker_, data, recv->buffer.data(), length, &rp);
  if (sp == nullptr) {
    self->OnAmReceived(reply_ep, msg_id, recv->buffer);
    delete recv;
  } else if (UCS_PTR_IS_ERR(sp)) {
    TLOG_WARN("{}: receiving a {}-byte message failed: {}", self->options_.name, length,
              ucs_status_string(UCS_PTR_STATUS(sp)));
    delete recv;
  }
  return UCS_OK;
}

void UcxContext::OnAmReceived(ucp_ep_h reply_ep, uint16_t msg_id, std::span<const uint8_t> bytes) {
  auto it = endpoints_.find(reply_ep);
  if (it == endpoints_.end()) {
    TLOG_WARN("{}: message {} from an unknown endpoint dropped", options_.name, msg_id);
    return;
  }
  counters_.messages_received++;
  counters_.message_bytes_received += bytes.size();
  std::shared_ptr<UcxEndpoint> ep = it->second;
  ep->NoteTraffic();
  Dispatch(ep, msg_id, bytes);
}

void UcxContext::Dispatch(const std::shared_ptr<UcxEndpoint>& ep, uint16_t msg_id,
                          std::span<const uint8_t> bytes) {
  if (msg_id == kConnectMsg) {
    if (ep->connected_) return;
    ep->connected_ = true;
    ep->SendNow(kConnectAckMsg, {}, {});
    // The handler came with the listener before it listened: a context-wide
    // one set after ucp_listener_create returned was missing for a request
    // that came at once, and that connection was acked but never handed up
    // (its peer's handshake then waited forever).
    if (auto accept = std::move(ep->on_accept_)) accept(ep);
    return;
  }
  if (msg_id == kConnectAckMsg) {
    if (ep->connected_ || !ep->connect_done_) return;
    ep->connected_ = true;
    auto cb = std::move(ep->connect_done_);
    ep->connect_done_ = nullptr;
    cb(std::shared_ptr<Endpoint>(ep));
    return;
  }
  if (!ep->connected_) {
    TLOG_WARN("{}: message {} from {} before its handshake; closing", options_.name, msg_id,
              ep->peer_);
    CloseEndpoint(ep.get(), true);
    return;
  }
  handlers_.Dispatch(ep, msg_id, bytes);
}

Counters UcxContext::counters() const {
  Counters c = counters_.Snapshot();
  AddLoopCounters(c);
  return c;
}

std::string UcxContext::Describe() const {
  const char* tls = std::getenv("UCX_TLS");
  return std::string("ucx ") + ucp_get_version_string() + " (UCX_TLS=" + (tls ? tls : "all") +
         (options_.busy_poll ? ", busy-poll" : ", sleeping progress") +
         ", memory types: " + MemoryTypeNames(memory_types_) + ")";
}

}  // namespace tessera::transport::ucx
