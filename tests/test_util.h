// Helpers shared by the test suites.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/cluster.h"
#include "tessera/status.h"

namespace tessera {
// So that a test can stream a Status into its failure message.
inline std::ostream& operator<<(std::ostream& os, const Status& st) { return os << st.ToString(); }
}  // namespace tessera

namespace tessera::testing {

// The value of `result`, or an exception naming `what` and the error. A
// helper that cannot go on fails its test this way (GoogleTest reports the
// exception, TearDown runs) and the binary's other tests still run.
template <typename T>
T ValueOrThrow(Result<T> result, const std::string& what) {
  if (!result.ok()) throw std::runtime_error(what + ": " + result.status().ToString());
  return std::move(*result);
}

// A one-shot completion a test can wait on with a bound.
template <typename T>
class Waiter {
 public:
  Waiter() : promise_(std::make_shared<std::promise<T>>()), future_(promise_->get_future()) {}
  auto callback() {
    return [p = promise_](T value) { p->set_value(std::move(value)); };
  }
  // Fails the calling test (via the optional) when nothing arrives in time.
  std::optional<T> Wait(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    if (future_.wait_for(limit) != std::future_status::ready) return std::nullopt;
    return future_.get();
  }

 private:
  std::shared_ptr<std::promise<T>> promise_;
  std::future<T> future_;
};

// A TCP port on 127.0.0.1 that nothing listens on right now. One port
// alone: two picks in a row can give the same port (nothing listens on it
// between them), and a spec refuses an address given twice.
uint16_t UnusedPort();
// `n` of them, all different: the tasks of one cluster spec.
std::vector<uint16_t> UnusedPorts(size_t n);
// `n` different ones that no task of `spec` has either: the tasks of a job
// added to a spec that holds others.
std::vector<uint16_t> UnusedPortsBeside(const ClusterSpec& spec, size_t n);

// Polls `done` until it holds or `limit` passes; whether it held. For tests
// that wait for a condition instead of sleeping "long enough".
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit);

// The resident set (VmRSS) of a process (0: this one), in KiB; -1 when unknown.
long RssKiB(pid_t pid = 0);

// A plain TCP connection to 127.0.0.1:port, for tests that play a peer who
// breaks every rule. Every read is bounded by `read_timeout`.
class RawTcpSocket {
 public:
  explicit RawTcpSocket(uint16_t port,
                        std::chrono::seconds read_timeout = std::chrono::seconds(30));
  ~RawTcpSocket();
  RawTcpSocket(const RawTcpSocket&) = delete;
  RawTcpSocket& operator=(const RawTcpSocket&) = delete;

  bool connected() const { return connected_; }
  void Send(std::span<const uint8_t> bytes);
  // Exactly n bytes from the server, or fewer when it closed or went quiet.
  std::vector<uint8_t> Read(size_t n);
  // How many bytes the server sent that are not read yet.
  size_t Unread() const;
  // True once the server closed the connection: reads until EOF or reset,
  // discarding what the server sent.
  bool ClosedByServer();

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// ps tasks as real `tessera server` processes (the binary named by
// TESSERA_BIN), for failures only a process has; killed when this goes.
class ShardProcesses {
 public:
  // Starts ps tasks 0..n-1 with `args` after "server"; `env` adds "K=V"
  // entries for one task (index -> entries). Where the spec has a
  // coordinator job, its task is started first, with the same args, as
  // index n (pid(n), Restart(n)).
  ShardProcesses(const ClusterSpec& spec, const std::string& secret, int n,
                 std::vector<std::string> args = {},
                 std::map<int, std::vector<std::string>> env = {});
  ~ShardProcesses();
  bool started() const { return !pids_.empty(); }
  pid_t pid(int i) const { return pids_[static_cast<size_t>(i)]; }
  // Starts ps task i again (after it was killed), without the extra env.
  void Restart(int i);
  // Waits up to `limit` for task i to exit; its wait status, or nullopt.
  std::optional<int> WaitExit(int i, std::chrono::milliseconds limit);
  // A clean shutdown: SIGTERM to the coordinator (ps task 0, or the
  // coordinator task) and waits for it, then the others.
  void StopAll();

 private:
  pid_t Spawn(int i, const std::vector<std::string>& env);
  ClusterSpec spec_;
  std::string secret_;
  std::vector<std::string> args_;
  int num_ps_ = 0;
  std::vector<pid_t> pids_;
};

}  // namespace tessera::testing
