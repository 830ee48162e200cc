#include "transport/sockaddr.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace tessera::transport {

std::string SockaddrToString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    port = ntohs(in6->sin6_port);
    // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d: named as
    // IPv4, so that one host has one name.
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof(host));
    } else {
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
      return "[" + std::string(host) + "]:" + std::to_string(port);
    }
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::vector<std::string> NumericAddressesOf(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<std::string> out;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    std::string name = SockaddrToString(s);
    name.erase(name.rfind(':'));
    if (name.front() == '[') name = name.substr(1, name.size() - 2);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  freeaddrinfo(res);
  return out;
}

Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (out.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&out)->sin6_port = htons(port);
  }
  return out;
}

// True when addr is one of this host's addresses (loopback included).
bool IsLocalAddress(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr).sin_addr;
    if ((ntohl(in.s_addr) >> 24) == 127) return true;
  } else if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&in6)) return true;
  } else {
    return false;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i && !local; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != addr.ss_family) continue;
    if (addr.ss_family == AF_INET) {
      local = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
              reinterpret_cast<const sockaddr_in&>(addr).sin_addr.s_addr;
    } else {
      local = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, 16) == 0;
    }
  }
  freeifaddrs(list);
  return local;
}

bool IsLoopbackAddress(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr).sin_addr;
    return (ntohl(in.s_addr) >> 24) == 127;
  }
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&in6);
  }
  return false;
}

socklen_t SockaddrLen(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

}  // namespace tessera::transport
