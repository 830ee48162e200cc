#include "rendezvous/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace tessera::rendezvous {
namespace {

int MillisLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits until `fd` is ready for `events`, or the deadline.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Result<Socket> ListenOn(uint16_t port) {
  const int one = 1, zero = 0;
  Socket s(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.valid()) {
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(port);
    if (bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(s.fd(), 256) == 0) {
      return s;
    }
  }
  // No IPv6 here: IPv4 alone.
  s = Socket(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) return Status::Internal(std::string("socket: ") + strerror(errno));
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  if (bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return Status::Unavailable(
        "the rendezvous cannot listen on port " + std::to_string(port) + ": " + strerror(errno) +
        (errno == EADDRINUSE ? " (another job's? set TESSERA_RENDEZVOUS_PORT)" : ""));
  }
  if (listen(s.fd(), 256) != 0) return Status::Internal(std::string("listen: ") + strerror(errno));
  return s;
}

Result<Socket> ConnectBefore(const std::string& host, uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const std::string where = host + ":" + service;
  std::string last = "no attempt";
  // Rank 0 may start listening after others try: refused and unreachable
  // are tried again (each attempt bounded) until the deadline.
  auto pause = std::chrono::milliseconds(20);
  while (true) {
    const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (rc == 0) {
      for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
        Socket s(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (!s.valid()) continue;
        SetNonBlocking(s.fd());
        if (connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
          last = strerror(errno);
          continue;
        }
        if (!WaitFor(s.fd(), POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(5)))) {
          last = "no answer to the connection";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last = strerror(err);
          continue;
        }
        const int one = 1;
        setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(found);
        return s;
      }
      freeaddrinfo(found);
    } else {
      last = gai_strerror(rc);
    }
    if (Clock::now() + pause >= deadline) break;
    std::this_thread::sleep_for(pause);  // the next attempt; rank 0 may not listen yet
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  return Status::DeadlineExceeded("the rendezvous at " + where + " could not be reached (" + last +
                                  ")");
}

Status WriteAllBefore(const Socket& s, std::span<const uint8_t> bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(s.fd(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(s.fd(), POLLOUT, deadline)) return Status::DeadlineExceeded("sending timed out");
      continue;
    }
    return Status::Unavailable(std::string("sending failed: ") + strerror(errno));
  }
  return Status::Ok();
}

Status ReadExactBefore(const Socket& s, uint8_t* out, size_t n, Clock::time_point deadline) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = recv(s.fd(), out + done, n - done, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return Status::Unavailable("the connection was closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!WaitFor(s.fd(), POLLIN, deadline)) return Status::DeadlineExceeded("no answer in time");
      continue;
    }
    return Status::Unavailable(std::string("reading failed: ") + strerror(errno));
  }
  return Status::Ok();
}

std::string PeerHost(const Socket& s) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getpeername(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, text, sizeof(text));
    return text;
  }
  const auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
  if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
    in_addr v4;
    std::memcpy(&v4, v6->sin6_addr.s6_addr + 12, 4);
    inet_ntop(AF_INET, &v4, text, sizeof(text));
    return text;
  }
  inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
  return text;
}

}  // namespace tessera::rendezvous
