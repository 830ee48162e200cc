// The congestion control of Tessera's own sockets (ContextOptions::
// tcp_congestion, TESSERA_TCP_CONGESTION): every socket the tcp backend
// makes (listener, accepted, connected) uses the one asked for, read back
// from the kernel; a name the kernel refuses fails the context and says
// what may be chosen.
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace tessera::transport {
namespace {

using namespace std::chrono_literals;

std::string HostDefault() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  std::getline(in, name);
  return name;
}

std::string CongestionOf(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name);
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

// The congestion control of every TCP socket this process holds.
std::vector<std::string> ProcessTcpSockets() {
  std::vector<std::string> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(dir)) continue;
    int proto = 0;
    socklen_t len = sizeof(proto);
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0 || proto != IPPROTO_TCP) {
      continue;
    }
    out.push_back(CongestionOf(fd));
  }
  closedir(dir);
  return out;
}

ContextOptions Tcp(const std::string& congestion) {
  ContextOptions o;
  o.backend = "tcp";
  o.tcp_congestion = congestion;
  return o;
}

// An algorithm this kernel lets the test choose that is not the host's
// default, so that a socket showing it shows the option at work.
std::string NotTheDefault() {
  for (const char* name : {"reno", "cubic"}) {
    if (name != HostDefault() && Context::Open(Tcp(name)).ok()) return name;
  }
  return "";
}

TEST(TcpCongestionTest, EverySocketUsesTheOneAskedFor) {
  const std::string chosen = NotTheDefault();
  if (chosen.empty()) GTEST_SKIP() << "neither reno nor cubic can be set beside " << HostDefault();
  auto server = Context::Open(Tcp(chosen));
  auto client = Context::Open(Tcp(chosen));
  ASSERT_TRUE(server.ok() && client.ok());
  std::promise<void> accepted;
  auto listener = (*server)->Listen(
      "127.0.0.1", 0, [&](const std::shared_ptr<Endpoint>&) { accepted.set_value(); });
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  std::promise<Result<std::shared_ptr<Endpoint>>> connected;
  (*client)->Connect("127.0.0.1", (*listener)->port(), 10s,
                     [&](Result<std::shared_ptr<Endpoint>> ep) { connected.set_value(ep); });
  auto ep = connected.get_future().get();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  accepted.get_future().get();

  const std::vector<std::string> sockets = ProcessTcpSockets();
  EXPECT_EQ(sockets.size(), 3u) << "a listener, the accepted and the connected socket";
  for (const auto& cc : sockets) EXPECT_EQ(cc, chosen);
  // A socket made without the option keeps the host's default.
  const int plain = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(plain, 0);
  EXPECT_EQ(CongestionOf(plain), HostDefault());
  close(plain);
  EXPECT_NE((*client)->Describe().find("congestion control " + chosen), std::string::npos)
      << (*client)->Describe();
}

TEST(TcpCongestionTest, TheEnvironmentChoosesWhenTheOptionIsEmpty) {
  const std::string chosen = NotTheDefault();
  if (chosen.empty()) GTEST_SKIP() << "neither reno nor cubic can be set beside " << HostDefault();
  setenv("TESSERA_TCP_CONGESTION", chosen.c_str(), 1);
  auto ctx = Context::Open(Tcp(""));
  unsetenv("TESSERA_TCP_CONGESTION");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_NE((*ctx)->Describe().find("congestion control " + chosen), std::string::npos)
      << (*ctx)->Describe();
  // Without either, the context leaves the host's choice alone.
  auto plain = Context::Open(Tcp(""));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->Describe().find("congestion control"), std::string::npos);
}

TEST(TcpCongestionTest, AnAlgorithmTheKernelRefusesFailsTheContextNamingIt) {
  auto ctx = Context::Open(Tcp("no-such-cc"));
  ASSERT_FALSE(ctx.ok());
  const std::string msg = ctx.status().ToString();
  EXPECT_NE(msg.find("'no-such-cc'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available here: "), std::string::npos) << msg;
  EXPECT_NE(msg.find(HostDefault()), std::string::npos) << msg;  // among what it may choose
}

}  // namespace
}  // namespace tessera::transport
