// The plain-socket bound for Tessera's own tcp transport: what a server that
// does nothing but move the bytes achieves on the same loopback, in the same
// run. ucx_perftest is a weak yardstick there (its puts collapse at 64 MiB
// and its gets take about a millisecond), so `--transport tcp` is compared
// with this instead.
//
// Both ends poll 200 µs before they block, as Tessera's do.
//
// One request is an 8-byte little-endian word: the operation in its top two
// bits, the size below. push: the client sends the word and N bytes, the
// server reads them all into its buffer and answers 8 bytes. pull: the
// client sends the word, the server answers N bytes. echo: N bytes each way.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "tools/bench_internal.h"

namespace tessera::tools::bench {
namespace {

constexpr uint64_t kOpShift = 62;
constexpr uint64_t kSizeMask = (uint64_t{1} << kOpShift) - 1;
// No request may wait longer than this for its peer: a broken baseline
// reports an error instead of hanging the bench.
constexpr int kIoTimeoutSeconds = 30;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

void Tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // The congestion control Tessera's tcp sockets are given, so that the
  // bound runs under the same one (a name the kernel refuses fails
  // Tessera's own contexts, saying so; here it leaves the host's).
  if (const char* cc = std::getenv("TESSERA_TCP_CONGESTION"); cc != nullptr && *cc != '\0') {
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, static_cast<socklen_t>(std::strlen(cc)));
  }
  timeval tv{kIoTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Polls for up to this long before blocking, as Tessera's shards and
// waiting callers do (ServerOptions::spin_before_sleep): otherwise the bound
// would carry a scheduler wake-up that Tessera does not pay.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);

bool ReadFull(int fd, uint8_t* p, uint64_t n) {
  const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
  bool spinning = true;
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, spinning ? MSG_DONTWAIT : 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && spinning && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      spinning = std::chrono::steady_clock::now() < spin_until;
      continue;
    }
    if (got <= 0) return false;
    p += got;
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

// Writes `head` then `n` bytes of `body`, in as few system calls as the
// kernel allows.
bool WriteFull(int fd, const void* head, size_t head_len, const uint8_t* body, uint64_t n) {
  iovec iov[2] = {{const_cast<void*>(head), head_len}, {const_cast<uint8_t*>(body), n}};
  int first = head_len > 0 ? 0 : 1;
  while (first < 2) {
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = static_cast<size_t>(2 - first);
    const ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0) return false;
    auto left = static_cast<size_t>(sent);
    while (first < 2 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < 2) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

void PinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Serves one connection until the client closes it.
void Serve(int listen_fd, uint64_t max_bytes, int cpu) {
  if (cpu >= 0) PinThisThread(cpu);
  Fd conn(accept(listen_fd, nullptr, nullptr));
  if (conn.get() < 0) return;
  Tune(conn.get());
  std::vector<uint8_t> buf(std::max<uint64_t>(max_bytes, 8), 0x3c);
  uint64_t word = 0;
  while (ReadFull(conn.get(), reinterpret_cast<uint8_t*>(&word), sizeof(word))) {
    const auto op = static_cast<SocketOp>(word >> kOpShift);
    const uint64_t n = std::min(word & kSizeMask, max_bytes);
    bool ok = true;
    if (op == SocketOp::kPush || op == SocketOp::kEcho) ok = ReadFull(conn.get(), buf.data(), n);
    if (ok && op == SocketOp::kPush) ok = WriteFull(conn.get(), &word, sizeof(word), nullptr, 0);
    if (ok && op != SocketOp::kPush) ok = WriteFull(conn.get(), nullptr, 0, buf.data(), n);
    if (!ok) return;
  }
}

}  // namespace

std::string SocketOpName(SocketOp op) {
  switch (op) {
    case SocketOp::kPush:
      return "socket push";
    case SocketOp::kPull:
      return "socket pull";
    case SocketOp::kEcho:
      return "socket echo";
  }
  return "socket";
}

Perftest RunSocketBaseline(SocketOp op, uint64_t size, int iters, int warmup, bool pin) {
  Perftest out;
  out.round_trip = true;
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener.get() < 0 ||
      bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener.get(), 1) != 0 ||
      getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    out.error = Errno("socket baseline: listening on 127.0.0.1");
    return out;
  }
  // The server on core 0, as the shards; the caller already runs on the
  // last core (tessera bench --pin).
  std::thread server(Serve, listener.get(), size, pin ? 0 : -1);
  Fd conn(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (conn.get() < 0 || connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr))) {
    out.error = Errno("socket baseline: connecting to 127.0.0.1");
    shutdown(listener.get(), SHUT_RDWR);  // the server's accept returns
    server.join();
    return out;
  }
  Tune(conn.get());
  std::vector<uint8_t> buf(std::max<uint64_t>(size, 8), 0xa5);
  const uint64_t word = (static_cast<uint64_t>(op) << kOpShift) | size;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(std::max(iters, 1)));
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok =
        WriteFull(conn.get(), &word, sizeof(word), buf.data(), op == SocketOp::kPull ? 0 : size) &&
        ReadFull(conn.get(), buf.data(), op == SocketOp::kPush ? sizeof(word) : size);
    const auto t1 = std::chrono::steady_clock::now();
    if (!ok) {
      out.error = Errno(("socket baseline: " + SocketOpName(op)).c_str());
      break;
    }
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  conn = Fd();  // the server sees the end and returns
  server.join();
  if (!out.error.empty() || us.empty()) return out;
  // Bytes moved per round trip: an echo carries them both ways, as
  // push_pull's rows count them.
  const Stats s = Summarise(std::move(us), op == SocketOp::kEcho ? 2 * size : size);
  out.ok = true;
  out.us = s.p50_us;
  out.p99_us = s.p99_us;
  out.gbps = s.gbps;
  return out;
}

}  // namespace tessera::tools::bench
