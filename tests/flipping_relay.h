// An on-path party without the secret, for the on-path tests: a relay on
// loopback between clients and a server that, once armed, flips one byte of
// what a client sends. What it relays is otherwise untouched.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::testing {

class FlippingRelay {
 public:
  // Relays each connection to 127.0.0.1:`target`.
  explicit FlippingRelay(uint16_t target);
  ~FlippingRelay();
  FlippingRelay(const FlippingRelay&) = delete;
  FlippingRelay& operator=(const FlippingRelay&) = delete;

  uint16_t port() const { return port_; }
  // Flips (xor 0x40) the byte that lies `ahead` bytes after what the first
  // connection's client has sent so far, in that direction.
  void Arm(uint64_t ahead);
  bool flipped() const { return flipped_.load(); }
  int connections() const { return connections_.load(); }

 private:
  struct Pair {
    int client = -1, server = -1;
    uint64_t from_client = 0;  // bytes relayed client -> server
    bool closed = false;
  };
  void Run();
  // Relays what `from` has to `to`; false once either side closed.
  bool Relay(int from, int to, Pair* pair, bool client_to_server);

  uint16_t target_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  std::vector<Pair> pairs_;        // the relay thread's; pairs_[0] is the first connection
  uint64_t flip_at_ = UINT64_MAX;  // guarded by mu_
  std::atomic<bool> flipped_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

}  // namespace tessera::testing
