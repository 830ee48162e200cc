#include "core/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

namespace tessera {
namespace {

bool Bindable(const sockaddr_in& base, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr = base;
  addr.sin_port = htons(port);
  const bool ok = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

uint16_t PickListenPort(const std::string& host) {
  sockaddr_in base{};
  base.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &base.sin_addr) != 1) return 0;
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (range >> low >> high && low > 1024) ephemeral_low = low;
  const int lo = 10000, hi = ephemeral_low - 1;
  if (hi > lo) {
    std::random_device rd;
    std::mt19937 rng(rd());
    std::uniform_int_distribution<int> pick(lo, hi);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const auto port = static_cast<uint16_t>(pick(rng));
      if (Bindable(base, port)) return port;
    }
  }
  // Fall back to whatever the kernel hands out.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr = base;
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::vector<uint16_t> PickListenPorts(const std::string& host, size_t n) {
  std::vector<uint16_t> ports;
  ports.reserve(n);
  // Bounded: a host with almost no free port gets 0s, whose binds then fail
  // loudly, rather than a loop that never ends.
  for (size_t attempt = 0; ports.size() < n && attempt < 100 * n + 100; ++attempt) {
    const uint16_t port = PickListenPort(host);
    if (port == 0 || std::find(ports.begin(), ports.end(), port) == ports.end()) {
      ports.push_back(port);
    }
  }
  ports.resize(n, 0);
  return ports;
}

}  // namespace tessera
