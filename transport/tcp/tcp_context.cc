#include "transport/tcp/tcp_context.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "transport/run_on_loop.h"
#include "transport/sockaddr.h"
#include "transport/tcp/tcp_congestion.h"

namespace tessera::transport::tcp {
namespace {

constexpr int kBacklog = 1024;

Status Errno(const std::string& what) {
  return Status::Unavailable(what + ": " + std::strerror(errno));
}

std::string PeerOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  return SockaddrToString(addr);
}

}  // namespace

class TcpListener final : public Listener {
 public:
  TcpListener(TcpContext* ctx, uint64_t token, uint16_t port)
      : ctx_(ctx), token_(token), port_(port) {}
  ~TcpListener() override {
    RunOnLoop(*ctx_, [this] {
      auto it = ctx_->listeners_.find(token_);
      if (it != ctx_->listeners_.end()) {
        ctx_->Unwatch(it->second.fd, token_);
        close(it->second.fd);
        ctx_->listeners_.erase(it);
      }
      return 0;
    });
  }
  uint16_t port() const override { return port_; }

 private:
  TcpContext* ctx_;
  uint64_t token_;
  uint16_t port_;
};

Result<std::unique_ptr<Context>> TcpContext::Create(const ContextOptions& options) {
  std::unique_ptr<TcpContext> ctx(new TcpContext(options));
  TESSERA_RETURN_IF_ERROR(ctx->Init());
  return std::unique_ptr<Context>(std::move(ctx));
}

void TcpContext::TuneSocket(int fd) const {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Checked in Init; a socket that still refuses keeps the host's default.
  SetCongestion(fd, options_.tcp_congestion);
}

Status TcpContext::Init() {
  options_.tcp_congestion = ChosenCongestion(options_.tcp_congestion);
  // Tried once here, so that a name the kernel refuses fails the context
  // at once instead of leaving every connection on the host's default.
  if (!options_.tcp_congestion.empty()) {
    TESSERA_RETURN_IF_ERROR(CheckCongestion(options_.tcp_congestion));
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Errno("epoll_create1");
  EventLoop::Hooks hooks;
  hooks.progress = [this] { return Progress(); };
  // Level-triggered: whatever is pending keeps the epoll fd readable, so the
  // loop never sleeps through it.
  hooks.arm = [] { return true; };
  hooks.event_fd = epoll_fd_;
  // A send the kernel could not take whole leaves EPOLLOUT watched, and a
  // short read left nothing unread: all work shows on the fd.
  hooks.fd_shows_all_work = true;
  auto loop = EventLoop::Create(options_.name, options_.busy_poll, std::move(hooks),
                                options_.spin_before_sleep);
  if (!loop.ok()) return loop.status();
  loop_ = std::move(*loop);
  UseLoop(loop_.get());
  loop_->Start();
  return Status::Ok();
}

TcpContext::~TcpContext() {
  if (loop_) {
    RunOnLoop(*this, [this] {
      std::vector<std::shared_ptr<TcpEndpoint>> eps;
      for (auto& [token, ep] : endpoints_) eps.push_back(ep);
      for (auto& ep : eps) ep->MarkDead(Status::Unavailable("transport closed"), false);
      for (auto& [token, l] : listeners_) close(l.fd);
      listeners_.clear();
      return 0;
    });
    loop_->Stop();
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status TcpContext::CanRegister(MemoryKind kind) const {
  if (kind == MemoryKind::kHost) return Status::Ok();
  return Status::FailedPrecondition(
      "the tcp transport reaches host memory only: GPU memory needs a fabric that maps it (UCX "
      "built with CUDA, verbs with dmabuf) or staging through host memory");
}

Result<std::unique_ptr<Region>> TcpContext::MakeRegion(uint8_t* data, size_t size,
                                                       RemoteAccess access, bool owned) {
  RegionRecord record;
  record.base = data;
  record.size = size;
  record.access = access;
  if (RAND_bytes(record.key.data(), static_cast<int>(record.key.size())) != 1) {
    if (owned) munmap(data, size);
    return Status::Unavailable("RAND_bytes failed: no entropy for a region key");
  }
  return std::unique_ptr<Region>(new TcpRegion(regions_, record, owned));
}

Result<std::unique_ptr<Region>> TcpContext::Allocate(size_t size, MemoryKind kind,
                                                     RemoteAccess access) {
  TESSERA_RETURN_IF_ERROR(CanRegister(kind));
  if (size == 0) return Status::InvalidArgument("cannot allocate an empty region");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Errno("allocating " + std::to_string(size) + " bytes");
  return MakeRegion(static_cast<uint8_t*>(p), size, access, /*owned=*/true);
}

Result<std::unique_ptr<Region>> TcpContext::Register(void* data, size_t size, MemoryKind kind,
                                                     RemoteAccess access) {
  TESSERA_RETURN_IF_ERROR(CanRegister(kind));
  if (data == nullptr || size == 0) return Status::InvalidArgument("cannot register no memory");
  return MakeRegion(static_cast<uint8_t*>(data), size, access, /*owned=*/false);
}

void TcpContext::SetHandler(uint16_t msg_id, MessageHandler handler) {
  handlers_.Set(msg_id, std::move(handler));
}

void TcpContext::SetDisconnectHandler(DisconnectHandler handler) {
  on_disconnect_ = std::move(handler);
}

uint64_t TcpContext::Watch(int fd, uint32_t events) {
  const uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  return token;
}

void TcpContext::Rewatch(int fd, uint64_t token, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void TcpContext::Unwatch(int fd, uint64_t /*token*/) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

Result<std::unique_ptr<Listener>> TcpContext::Listen(const std::string& host, uint16_t port,
                                                     AcceptHandler on_accept) {
  auto addr = Resolve(host, port);
  if (!addr.ok()) return addr.status();
  const int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  TuneSocket(fd);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), SockaddrLen(*addr)) != 0) {
    Status st = errno == EADDRINUSE
                    ? Status::Unavailable("listen on " + host + ":" + std::to_string(port) +
                                          ": the port is in use by another process")
                    : Errno("listen on " + host + ":" + std::to_string(port));
    close(fd);
    return st;
  }
  if (listen(fd, kBacklog) != 0) {
    Status st = Errno("listen on " + host + ":" + std::to_string(port));
    close(fd);
    return st;
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const uint16_t bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const uint64_t token = RunOnLoop(*this, [&] {
    const uint64_t t = Watch(fd, EPOLLIN);
    listeners_[t] = ListenState{fd, std::move(on_accept), false};
    return t;
  });
  return std::unique_ptr<Listener>(new TcpListener(this, token, bound_port));
}

void TcpContext::OnListenerReadable(uint64_t token) {
  auto it = listeners_.find(token);
  if (it == listeners_.end() || it->second.paused) return;
  // A bounded batch per turn: a flood of connections does not starve the
  // connections already served.
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(it->second.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop accepting for a moment instead of
        // spinning on a listener that stays readable.
        TLOG_WARN("{}: cannot accept connections: {}; pausing the listener for 100 ms",
                  options_.name, std::strerror(errno));
        it->second.paused = true;
        Rewatch(it->second.fd, token, 0);
        PostAfter(std::chrono::milliseconds(100), [this, token] {
          auto l = listeners_.find(token);
          if (l == listeners_.end()) return;
          l->second.paused = false;
          Rewatch(l->second.fd, token, EPOLLIN);
        });
      }
      return;
    }
    TuneSocket(fd);
    auto ep = std::make_shared<TcpEndpoint>(this, fd, PeerOf(fd), options_);
    ep->token_ = Watch(fd, EPOLLIN);
    endpoints_[ep->token_] = ep;
    ep->OnConnected();  // sends the preamble
    if (it->second.on_accept) it->second.on_accept(ep);
    it = listeners_.find(token);  // the handler may have closed the listener
    if (it == listeners_.end()) return;
  }
}

void TcpContext::Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                         ConnectCallback done) {
  Post([this, host, port, timeout, done = std::move(done)]() mutable {
    const std::string where = host + ":" + std::to_string(port);
    auto addr = Resolve(host, port);
    if (!addr.ok()) return done(addr.status());
    const int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return done(Errno("socket"));
    TuneSocket(fd);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), SockaddrLen(*addr)) != 0 &&
        errno != EINPROGRESS) {
      Status st = Errno("connection to " + where + " failed");
      close(fd);
      return done(st);
    }
    auto ep = std::make_shared<TcpEndpoint>(this, fd, where, options_);
    ep->connecting_ = true;
    ep->connect_done_ = std::move(done);
    ep->token_ = Watch(fd, EPOLLIN | EPOLLOUT);
    ep->want_write_ = true;
    endpoints_[ep->token_] = ep;
    std::weak_ptr<TcpEndpoint> weak = ep;
    PostAfter(timeout, [weak, where, timeout] {
      auto e = weak.lock();
      if (e && e->connect_done_) {
        e->MarkDead(Status::DeadlineExceeded("connection to " + where + " not established within " +
                                             std::to_string(timeout.count()) + " ms"),
                    false);
      }
    });
  });
}

bool TcpContext::Progress() {
  // The connection that alone was readable last time is read first; epoll
  // is asked on every turn all the same, so that no other connection waits
  // behind it.
  bool read = false;
  if (auto recent = recent_reader_.lock()) read = recent->ReadNow();
  epoll_event events[64];
  const int n = epoll_wait(epoll_fd_, events, 64, 0);
  if (n == 1 && (events[0].events & EPOLLIN)) {
    const uint64_t token = events[0].data.u64;  // a copy: epoll_event is packed
    auto it = endpoints_.find(token);
    recent_reader_ = it == endpoints_.end() ? nullptr : it->second;
  }
  for (int i = 0; i < n; ++i) {
    const uint64_t token = events[i].data.u64;
    if (listeners_.count(token) != 0) {
      OnListenerReadable(token);
      continue;
    }
    auto it = endpoints_.find(token);
    if (it == endpoints_.end()) continue;  // closed earlier in this batch
    std::shared_ptr<TcpEndpoint> ep = it->second;
    ep->OnEvents(events[i].events);
  }
  return read || n > 0;
}

void TcpContext::Dispatch(const std::shared_ptr<TcpEndpoint>& ep, uint16_t msg_id,
                          std::span<const uint8_t> bytes) {
  counters_.messages_received++;
  counters_.message_bytes_received += bytes.size();
  handlers_.Dispatch(ep, msg_id, bytes);
}

Counters TcpContext::counters() const {
  Counters c = counters_.Snapshot();
  AddLoopCounters(c);
  return c;
}

std::string TcpContext::Describe() const {
  return std::string("tcp (Tessera's sockets, epoll; ") +
         (options_.busy_poll ? "busy-poll" : "sleeping progress") +
         (options_.tcp_congestion.empty() ? ""
                                          : "; congestion control " + options_.tcp_congestion) +
         ")";
}

}  // namespace tessera::transport::tcp
