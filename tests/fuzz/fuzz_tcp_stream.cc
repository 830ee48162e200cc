// Tessera's tcp transport against any byte stream a peer could send: the
// input goes down a real loopback connection to a real context (preamble,
// frame headers, messages, puts and gets at its regions), then the
// connection is half-closed and the target must close it in turn. The first
// input byte says whether the layer above marks the peer authenticated, so
// that the one-sided paths past that check are fuzzed too; its second bit,
// whether the connection is protected (Endpoint::ProtectSession, fixed
// keys). A protected stream's third bit says whether the harness seals it:
// then the input after the preamble is taken as frames (a 48-byte header,
// then as many payload bytes as the header's type and length say, cut at
// the input's end), each sealed as a correct peer would (a message as one
// record, another frame's header and payload as two), so that the frame
// logic behind the cipher is fuzzed too; else the bytes go as they are and
// must fail their check. A region the target registered read-only and
// unknown to the peer must never change.
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

#include <openssl/crypto.h>

#include "fuzz_check.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_session_cipher.h"
#include "transport/transport.h"

namespace {

using namespace tessera::transport;

tessera::SessionKeys Keys(bool server) {
  tessera::SessionKeys k;
  k.send.key.fill(server ? 1 : 2);
  k.receive.key.fill(server ? 2 : 1);
  k.send.iv.fill(server ? 3 : 4);
  k.receive.iv.fill(server ? 4 : 3);
  return k;
}

// The input's frames, each sealed as a correct peer would seal it.
std::vector<uint8_t> Sealed(const uint8_t* data, size_t size) {
  namespace tcp = tessera::transport::tcp;
  auto cipher = tcp::SessionCipher::Create(Keys(false).send,
                                           {.direction = tcp::SessionCipher::Direction::kSeal})
                    .value();
  std::vector<uint8_t> out(data, data + std::min(size, tcp::kPreamble.size()));
  size_t at = out.size();
  while (at < size) {
    const size_t header = std::min(size - at, tcp::kFrameHeaderBytes);
    std::array<uint8_t, tcp::kFrameHeaderBytes> h{};
    std::memcpy(h.data(), data + at, header);
    at += header;
    auto decoded = tcp::DecodeFrameHeader(h);
    if (decoded.ok() && decoded->type == tcp::FrameType::kMessage) {
      // A message is one record: its header and body.
      const size_t body = static_cast<size_t>(std::min<uint64_t>(decoded->length, size - at));
      const size_t base = out.size();
      out.resize(base + h.size() + body + tcp::kSealTagBytes);
      cipher->Begin();
      cipher->Update(h.data(), out.data() + base, h.size());
      cipher->Update(data + at, out.data() + base + h.size(), body);
      cipher->EndSeal(out.data() + base + h.size() + body);
      at += body;
      continue;
    }
    const size_t base = out.size();
    out.resize(base + h.size() + tcp::kSealTagBytes);
    cipher->Seal(h.data(), h.size(), out.data() + base);
    if (!decoded.ok() || decoded->type == tcp::FrameType::kGet ||
        decoded->type == tcp::FrameType::kPutDone) {
      continue;
    }
    const size_t payload = static_cast<size_t>(std::min<uint64_t>(decoded->length, size - at));
    if (payload == 0) continue;
    const size_t p = out.size();
    out.resize(p + payload + tcp::kSealTagBytes);
    cipher->Seal(data + at, payload, out.data() + p);
    at += payload;
  }
  return out;
}

struct Target {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Region> writable, guarded;
  std::vector<uint8_t> guarded_before;
  std::mutex mu;
  bool authenticate = false;  // for the next connection
  bool protect = false;

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
                             if (protect) (void)ep->ProtectSession(Keys(/*server=*/true));
                           })
                   .value();
  }
};

Target& TheTarget() {
  // The target lives for the whole run, its loop thread too, so OpenSSL
  // must not tear its tables down at exit under that thread (TSan saw
  // its atexit cleanup free what a session's cipher had looked up).
  static bool no_atexit = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  (void)no_atexit;
  static Target* target = new Target();
  return *target;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Target& t = TheTarget();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    t.authenticate = data[0] & 1;
    t.protect = data[0] & 2;
  }
  std::vector<uint8_t> sealed;
  if ((data[0] & 6) == 6) sealed = Sealed(data + 1, size - 1);
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
  if ((data[0] & 6) == 6) {
    (void)send(fd, sealed.data(), sealed.size(), MSG_NOSIGNAL);
  } else {
    (void)send(fd, data + 1, size - 1, MSG_NOSIGNAL);
  }
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
