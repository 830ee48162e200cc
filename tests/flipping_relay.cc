#include "tests/flipping_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace tessera::testing {
namespace {

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

FlippingRelay::FlippingRelay(uint16_t target) : target_(target) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || pipe(wake_) != 0) {
    throw std::runtime_error("the relay could not listen on loopback");
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Run(); });
}

FlippingRelay::~FlippingRelay() {
  const uint8_t stop = 1;
  (void)!write(wake_[1], &stop, 1);
  thread_.join();
  for (auto& p : pairs_) {
    close(p.client);
    close(p.server);
  }
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void FlippingRelay::Arm(uint64_t ahead) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t sent = pairs_.empty() ? 0 : pairs_[0].from_client;
  flip_at_ = sent + ahead;
}

void FlippingRelay::Run() {
  for (;;) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    std::vector<size_t> owner;  // the pair of fds[2 + 2k] and fds[3 + 2k]
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t k = 0; k < pairs_.size(); ++k) {
        if (pairs_[k].closed) continue;
        fds.push_back({pairs_[k].client, POLLIN, 0});
        fds.push_back({pairs_[k].server, POLLIN, 0});
        owner.push_back(k);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    if (fds[1].revents & POLLIN) {
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      to.sin_port = htons(target_);
      if (client >= 0 && server >= 0 &&
          connect(server, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
        const int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        std::lock_guard<std::mutex> lock(mu_);
        pairs_.push_back({client, server, 0});
        connections_++;
      } else {
        if (client >= 0) close(client);
        if (server >= 0) close(server);
      }
      continue;
    }
    for (size_t i = 2; i + 1 < fds.size(); i += 2) {
      Pair* pair;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pair = &pairs_[owner[(i - 2) / 2]];
      }
      bool open = true;
      if (fds[i].revents != 0) open = Relay(pair->client, pair->server, pair, true);
      if (open && fds[i + 1].revents != 0) open = Relay(pair->server, pair->client, pair, false);
      if (!open) {
        // One side closed: so does the other (the pair stays, closed, for the indexes).
        shutdown(pair->client, SHUT_RDWR);
        shutdown(pair->server, SHUT_RDWR);
        std::lock_guard<std::mutex> lock(mu_);
        pair->closed = true;
      }
    }
  }
}

bool FlippingRelay::Relay(int from, int to, Pair* pair, bool client_to_server) {
  uint8_t buf[64 * 1024];
  const ssize_t r = recv(from, buf, sizeof(buf), 0);
  if (r < 0 && errno == EINTR) return true;
  if (r <= 0) return false;
  if (client_to_server) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t start = pair->from_client;
    if (pair == &pairs_[0] && flip_at_ >= start && flip_at_ < start + static_cast<uint64_t>(r)) {
      buf[flip_at_ - start] ^= 0x40;
      flipped_ = true;
    }
    pair->from_client += static_cast<uint64_t>(r);
  }
  return WriteAll(to, buf, static_cast<size_t>(r));
}

}  // namespace tessera::testing
