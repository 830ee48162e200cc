#include "tests/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <thread>

#include "core/ports.h"

namespace tessera::testing {

uint16_t UnusedPort() { return PickListenPort("127.0.0.1"); }
std::vector<uint16_t> UnusedPorts(size_t n) { return PickListenPorts("127.0.0.1", n); }

std::vector<uint16_t> UnusedPortsBeside(const ClusterSpec& spec, size_t n) {
  size_t taken = 0;
  for (const auto& [job, tasks] : spec.jobs()) taken += tasks.size();
  std::vector<uint16_t> ports = PickListenPorts("127.0.0.1", n + taken);
  std::erase_if(ports, [&](uint16_t port) {
    for (const auto& [job, tasks] : spec.jobs()) {
      for (const auto& t : tasks) {
        if (t.port == port) return true;
      }
    }
    return false;
  });
  ports.resize(n);
  return ports;
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

ShardProcesses::ShardProcesses(const ClusterSpec& spec, const std::string& secret, int n,
                               std::vector<std::string> args,
                               std::map<int, std::vector<std::string>> env)
    : spec_(spec), secret_(secret), args_(std::move(args)), num_ps_(n) {
  if (std::getenv("TESSERA_BIN") == nullptr) return;
  pids_.assign(static_cast<size_t>(n), -1);
  if (spec_.separate_coordinator()) pids_.push_back(Spawn(n, env[n]));
  for (int i = 0; i < n; ++i) pids_[static_cast<size_t>(i)] = Spawn(i, env[i]);
}

ShardProcesses::~ShardProcesses() {
  for (pid_t pid : pids_) {
    if (pid <= 0) continue;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

pid_t ShardProcesses::Spawn(int i, const std::vector<std::string>& env) {
  const char* bin = std::getenv("TESSERA_BIN");
  std::vector<std::string> argv = {bin, "server"};
  argv.insert(argv.end(), args_.begin(), args_.end());
  const TaskId task = i < num_ps_ ? TaskId{"ps", i} : spec_.coordinator();
  const std::string tf_config = ToTfConfigJson(spec_, task);
  // Everything the child needs is built before the fork: between fork and
  // exec a child of a threaded process may only make async-signal-safe
  // calls (an allocator or environment lock held by another thread at the
  // fork would never be released; seen as a restarted shard that never
  // started, under ASan).
  std::vector<std::string> envs = {"TESSERA_SECRET=" + secret_, "TF_CONFIG=" + tf_config};
  envs.insert(envs.end(), env.begin(), env.end());
  auto overridden = [&](const char* kv) {
    const std::string_view s(kv);
    const std::string_view name = s.substr(0, s.find('='));
    return std::any_of(envs.begin(), envs.end(), [&](const std::string& e) {
      return std::string_view(e).substr(0, e.find('=')) == name;
    });
  };
  std::vector<char*> cenv;
  for (auto& e : envs) cenv.push_back(e.data());
  for (char** e = environ; *e != nullptr; ++e) {
    if (!overridden(*e)) cenv.push_back(*e);
  }
  cenv.push_back(nullptr);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    execve(bin, cargv.data(), cenv.data());
    _exit(127);
  }
  return pid;
}

void ShardProcesses::Restart(int i) {
  pid_t& pid = pids_[static_cast<size_t>(i)];
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  pid = Spawn(i, {});
}

std::optional<int> ShardProcesses::WaitExit(int i, std::chrono::milliseconds limit) {
  pid_t& pid = pids_[static_cast<size_t>(i)];
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (pid > 0) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

void ShardProcesses::StopAll() {
  // The coordinator first: it takes its final checkpoint while the others
  // still serve.
  const int coordinator = spec_.separate_coordinator() ? num_ps_ : 0;
  const auto c = static_cast<size_t>(coordinator);
  if (c < pids_.size() && pids_[c] > 0) kill(pids_[c], SIGTERM);
  WaitExit(coordinator, std::chrono::seconds(30));
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] > 0) kill(pids_[i], SIGTERM);
  }
  for (size_t i = 0; i < pids_.size(); ++i) WaitExit(static_cast<int>(i), std::chrono::seconds(30));
}

long RssKiB(pid_t pid) {
  std::ifstream status(pid == 0 ? "/proc/self/status" : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

RawTcpSocket::RawTcpSocket(uint16_t port, std::chrono::seconds read_timeout) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  timeval tv{static_cast<time_t>(read_timeout.count()), 0};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

RawTcpSocket::~RawTcpSocket() {
  if (fd_ >= 0) close(fd_);
}

void RawTcpSocket::Send(std::span<const uint8_t> bytes) {
  (void)send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

std::vector<uint8_t> RawTcpSocket::Read(size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd_, out.data() + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

size_t RawTcpSocket::Unread() const {
  int n = 0;
  return ioctl(fd_, FIONREAD, &n) == 0 && n > 0 ? static_cast<size_t>(n) : 0;
}

bool RawTcpSocket::ClosedByServer() {
  uint8_t buf[4096];
  while (true) {
    const ssize_t r = recv(fd_, buf, sizeof(buf), 0);
    if (r == 0) return true;
    if (r < 0) return errno == ECONNRESET;
  }
}

}  // namespace tessera::testing
