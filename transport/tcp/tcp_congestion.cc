#include "transport/tcp/tcp_congestion.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "transport/probe.h"

namespace tessera::transport {
namespace tcp {
namespace {

// One line of a /proc/sys file, for the error that names what may be chosen.
std::string ProcLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line.empty() ? "unknown" : line;
}

}  // namespace

std::string HostCongestion() { return ProcLine("/proc/sys/net/ipv4/tcp_congestion_control"); }

std::string ChosenCongestion(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("TESSERA_TCP_CONGESTION");
  return env != nullptr ? env : "";
}

int SetCongestion(int fd, const std::string& name) {
  if (name.empty()) return 0;
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                    static_cast<socklen_t>(name.size()));
}

Status CheckCongestion(const std::string& name) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  const int rc = SetCongestion(fd, name);
  const int err = errno;
  close(fd);
  if (rc == 0) return Status::Ok();
  return Status::InvalidArgument(
      "tcp congestion control '" + name + "' (TESSERA_TCP_CONGESTION or " +
      "ContextOptions::tcp_congestion): the kernel refused it: " + std::strerror(err) +
      "; available here: " + ProcLine("/proc/sys/net/ipv4/tcp_available_congestion_control") +
      "; without CAP_NET_ADMIN only: " +
      ProcLine("/proc/sys/net/ipv4/tcp_allowed_congestion_control"));
}

}  // namespace tcp

ProbeFinding ProbeTcpCongestion() {
  ProbeFinding f{"tcp-congestion", "ok", "", ""};
  const std::string host = tcp::HostCongestion();
  const std::string chosen = tcp::ChosenCongestion("");
  f.data = {{"host_default", host},
            {"tessera", chosen.empty() ? host : chosen},
            {"from_environment", !chosen.empty()}};
  if (!chosen.empty()) {
    if (Status st = tcp::CheckCongestion(chosen); !st.ok()) {
      f.level = "problem";
      f.detail = st.message();
      f.fix = "set TESSERA_TCP_CONGESTION to one of the algorithms allowed, or unset it";
      return f;
    }
    f.detail = "Tessera's tcp sockets use " + chosen + " (TESSERA_TCP_CONGESTION); the host's " +
               "default is " + host;
    return f;
  }
  f.detail = "Tessera's tcp sockets use the host's default, " + host;
  if (host == "bbr") {
    // Measured: docs/PERFORMANCE.md, "Across network namespaces, and bbr".
    f.level = "warn";
    f.detail +=
        ": between pods or network namespaces (veth) its paced packets arrived "
        "reordered and were sent again, and Tessera's calls ran about 2x slower than "
        "under reno or cubic";
    f.fix = "TESSERA_TCP_CONGESTION=reno in every task's environment (Tessera's sockets only)";
  }
  return f;
}

}  // namespace tessera::transport
