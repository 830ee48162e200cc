// Tessera's tcp transport against any byte stream a peer could send: the
// input goes down a real loopback connection to a real context (preamble,
// frame headers, messages, puts and gets at its regions), then the
// connection is half-closed and the target must close it in turn. The first
// input byte says whether the layer above marks the peer authenticated, so
// that the one-sided paths past that check are fuzzed too. A region the
// target registered read-only and unknown to the peer must never change.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "fuzz_check.h"
#include "transport/transport.h"

namespace {

using namespace tessera::transport;

struct Target {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Region> writable, guarded;
  std::vector<uint8_t> guarded_before;
  std::mutex mu;
  bool authenticate = false;  // for the next connection

  Target() {
    ContextOptions o;
    o.backend = "tcp";
    o.name = "fuzz-target";
    ctx = Context::Open(o).value();
    writable = ctx->Allocate(1 << 16, MemoryKind::kHost, RemoteAccess::kReadWrite).value();
    guarded = ctx->Allocate(1 << 12, MemoryKind::kHost, RemoteAccess::kRead).value();
    std::memset(guarded->data(), 0x5a, guarded->size());
    guarded_before.assign(static_cast<uint8_t*>(guarded->data()),
                          static_cast<uint8_t*>(guarded->data()) + guarded->size());
    ctx->SetHandler(1, [](const std::shared_ptr<Endpoint>&, std::span<const uint8_t>) {});
    listener = ctx->Listen("127.0.0.1", 0,
                           [this](const std::shared_ptr<Endpoint>& ep) {
                             std::lock_guard<std::mutex> lock(mu);
                             if (authenticate) ep->MarkAuthenticated();
                           })
                   .value();
  }
};

Target& TheTarget() {
  static Target* target = new Target();  // lives for the whole run
  return *target;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Target& t = TheTarget();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    t.authenticate = data[0] & 1;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(t.listener->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINTR) {
    // libFuzzer's timer signal: the connect goes on; wait for its outcome.
    pollfd p{fd, POLLOUT, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    std::fprintf(stderr, "connect: %s\n", std::strerror(errno));
    FUZZ_CHECK(false, "cannot connect to the target");
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)send(fd, data + 1, size - 1, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  // The target closes once it has read everything (or refused the stream).
  uint8_t buf[4096];
  ssize_t r;
  // (libFuzzer's timer signal interrupts the wait: EINTR is no answer.)
  while ((r = recv(fd, buf, sizeof(buf), 0)) > 0 || (r < 0 && errno == EINTR)) {
  }
  if (r < 0 && errno != ECONNRESET) std::fprintf(stderr, "recv: %s\n", std::strerror(errno));
  FUZZ_CHECK(r == 0 || errno == ECONNRESET, "the target kept a half-closed connection open");
  // Closed with a reset: the target closed first, and thousands of its
  // connections a second left in TIME_WAIT would use up loopback's ports.
  linger abort{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
  close(fd);
  FUZZ_CHECK(std::memcmp(t.guarded->data(), t.guarded_before.data(), t.guarded_before.size()) == 0,
             "a read-only region changed");
  return 0;
}
