// Blocking TCP sockets with deadlines, for the rendezvous: a few short
// exchanges per task, once per job, before any fabric exists.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "tessera/status.h"

namespace tessera::rendezvous {

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Listens on every address (IPv6 and IPv4) on `port`, non-blocking.
Result<Socket> ListenOn(uint16_t port);
// Connects to host:port, trying again while nothing listens there yet,
// until `deadline`.
Result<Socket> ConnectBefore(const std::string& host, uint16_t port, Clock::time_point deadline);
Status WriteAllBefore(const Socket& s, std::span<const uint8_t> bytes, Clock::time_point deadline);
Status ReadExactBefore(const Socket& s, uint8_t* out, size_t n, Clock::time_point deadline);
// The peer's numeric address (IPv4-mapped IPv6 shown as IPv4).
std::string PeerHost(const Socket& s);

}  // namespace tessera::rendezvous
