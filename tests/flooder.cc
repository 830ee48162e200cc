// A stranger's flood of a ps task's port, as the hardening review made it:
// connections that say nothing, that say hello and never answer the
// challenge, or that guess at the secret, from one address or from
// addresses rotated through 127/8. Plain sockets and Tessera's tcp frames,
// so that it is as fast as the machine allows; it prints what it did as one
// JSON line. Used by SecurityTest's flood cases and to measure promise 1
// (docs/security.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/tcp_frame.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace {

using Clock = std::chrono::steady_clock;
using tessera::transport::tcp::FrameHeader;
using tessera::transport::tcp::kFrameHeaderBytes;
using tessera::transport::tcp::kPreamble;

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string mode = "hello";  // silent | hello | guess
  double seconds = 5;
  int threads = 1;
  size_t hold = 64;  // connections each thread keeps open (silent, hello)
  bool rotate = false;
};

struct Counts {
  std::atomic<uint64_t> connections{0}, guesses{0}, refused{0}, failed{0};
};

std::vector<uint8_t> Framed(std::span<const uint8_t> message) {
  std::vector<uint8_t> out(kFrameHeaderBytes + message.size());
  FrameHeader h;
  h.msg_id = 1;
  h.length = message.size();
  tessera::transport::tcp::EncodeFrameHeader(h,
                                             std::span<uint8_t, kFrameHeaderBytes>(out.data(), 48));
  std::copy(message.begin(), message.end(), out.begin() + kFrameHeaderBytes);
  return out;
}

bool WriteAll(int fd, std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return true;
}

bool ReadAll(int fd, uint8_t* out, size_t n) {
  while (n > 0) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) != 1) return false;
    const ssize_t r = recv(fd, out, n, 0);
    if (r <= 0) return false;
    out += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The server's next message (after its preamble), or empty.
std::vector<uint8_t> ReadMessage(int fd) {
  std::array<uint8_t, kFrameHeaderBytes> hdr{};
  if (!ReadAll(fd, hdr.data(), hdr.size())) return {};
  auto h = tessera::transport::tcp::DecodeFrameHeader(hdr);
  if (!h.ok() || h->length > (1u << 20)) return {};
  std::vector<uint8_t> body(h->length);
  if (!ReadAll(fd, body.data(), body.size())) return {};
  return body;
}

// Source ports above the kernel's ephemeral range (ip_local_port_range,
// 32768-60999 by default), so that a flood of 100,000 connections does not
// take the ports other tests on the machine pick with bind(0) and connect
// from; and closed with a reset, so that none waits in TIME_WAIT.
constexpr uint16_t kFirstSourcePort = 61000;
constexpr uint16_t kSourcePorts = 4000;

int Connect(const Options& o, std::minstd_rand& rng) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr =
      o.rotate ? htonl((127u << 24) | ((rng() % 0xfffffe) + 1)) : htonl(INADDR_LOOPBACK);
  bool bound = false;
  for (int tries = 0; tries < 8 && !bound; ++tries) {
    src.sin_port = htons(static_cast<uint16_t>(kFirstSourcePort + rng() % kSourcePorts));
    bound = bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) == 0;
  }
  if (!bound) {
    close(fd);
    return -1;
  }
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(o.port));
  inet_pton(AF_INET, o.host.c_str(), &dst.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

tessera::wire::Hello StrangerHello() {
  tessera::wire::Hello hello;
  hello.task = "/job:worker/task:0";
  hello.cluster = R"({"ps":["127.0.0.1:1"],"worker":["127.0.0.1:2"]})";
  return hello;
}

// One guess: hello, the challenge answered with a wrong secret, the verdict.
void Guess(int fd, Counts& counts) {
  tessera::wire::ClientHandshake handshake("not the cluster secret, a guess", StrangerHello());
  std::vector<uint8_t> out(kPreamble.begin(), kPreamble.end());
  const auto hello = Framed(tessera::wire::Encode(handshake.hello(), 1));
  out.insert(out.end(), hello.begin(), hello.end());
  std::array<uint8_t, 8> preamble{};
  if (!WriteAll(fd, out) || !ReadAll(fd, preamble.data(), preamble.size())) {
    counts.failed++;
    return;
  }
  auto first = ReadMessage(fd);
  auto next = handshake.OnFrame(first, std::nullopt, "the shard");
  if (!next.ok() || !std::holds_alternative<tessera::wire::Auth>(*next)) {
    (next.ok() ? counts.failed : counts.refused)++;
    return;
  }
  if (!WriteAll(fd, Framed(tessera::wire::Encode(std::get<tessera::wire::Auth>(*next), 2)))) {
    counts.failed++;
    return;
  }
  // Checked and refused (PermissionDenied): a guess; refused unchecked: not.
  auto verdict = tessera::wire::Decode<tessera::wire::Error>(ReadMessage(fd));
  if (!verdict.ok()) {
    counts.failed++;
  } else if (verdict->code == tessera::StatusCode::kPermissionDenied) {
    counts.guesses++;
  } else {
    counts.refused++;
  }
}

void Flood(const Options& o, Clock::time_point until, Counts& counts, unsigned seed) {
  std::minstd_rand rng(seed);
  std::vector<uint8_t> hello(kPreamble.begin(), kPreamble.end());
  const auto framed = Framed(tessera::wire::Encode(StrangerHello(), 1));
  hello.insert(hello.end(), framed.begin(), framed.end());
  std::deque<int> held;
  while (Clock::now() < until) {
    const int fd = Connect(o, rng);
    if (fd < 0) {
      counts.failed++;
      continue;
    }
    counts.connections++;
    if (o.mode == "guess") {
      Guess(fd, counts);
      close(fd);
      continue;
    }
    if (o.mode == "hello") (void)WriteAll(fd, hello);
    held.push_back(fd);
    if (held.size() > o.hold) {
      close(held.front());
      held.pop_front();
    }
  }
  for (int fd : held) close(fd);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  CLI::App app{"A stranger's flood of a ps task's port (for tests)"};
  app.add_option("--host", o.host);
  app.add_option("--port", o.port)->required();
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"silent", "hello", "guess"}));
  app.add_option("--seconds", o.seconds);
  app.add_option("--threads", o.threads)->check(CLI::Range(1, 64));
  app.add_option("--hold", o.hold);
  app.add_flag("--rotate", o.rotate, "a random source address in 127/8 for each connection");
  CLI11_PARSE(app, argc, argv);

  Counts counts;
  const auto start = Clock::now();
  const auto until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(o.threads));
  for (int i = 0; i < o.threads; ++i) {
    threads.emplace_back([&, i] { Flood(o, until, counts, std::random_device{}() + i); });
  }
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "{\"mode\": \"%s\", \"seconds\": %.3f, \"connections\": %llu, \"per_second\": %.0f, "
      "\"guesses\": %llu, \"guesses_per_second\": %.1f, \"refused\": %llu, \"failed\": %llu}\n",
      o.mode.c_str(), took, static_cast<unsigned long long>(counts.connections.load()),
      static_cast<double>(counts.connections.load()) / took,
      static_cast<unsigned long long>(counts.guesses.load()),
      static_cast<double>(counts.guesses.load()) / took,
      static_cast<unsigned long long>(counts.refused.load()),
      static_cast<unsigned long long>(counts.failed.load()));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flooder: %s\n", e.what());
  return 1;
}
