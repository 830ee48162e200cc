// The native tcp transport against a peer that speaks its frames by hand and
// breaks every rule: forged keys, writes before authenticating, writes to
// read-only memory or past a region, garbage, lying lengths. Each attack
// must close the attacker's connection, leave the memory untouched, and
// leave the transport serving others. (Over UCX tcp, each of these wrote the
// memory or crashed the server: docs/security.md.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "tests/test_util.h"
#include "transport/region_desc.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_region.h"
#include "transport/transport.h"

namespace tessera::transport::tcp {
namespace {

using namespace std::chrono_literals;

// A socket that speaks the tcp transport's frames without a transport.
class Attacker {
 public:
  explicit Attacker(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{20, 0};  // a bound on every read below
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Attacker() { close(fd_); }
  bool connected() const { return connected_; }

  void Raw(std::span<const uint8_t> bytes) {
    (void)send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  void Preamble() { Raw(kPreamble); }
  void Frame(const FrameHeader& h, std::span<const uint8_t> payload = {}) {
    std::array<uint8_t, kFrameHeaderBytes> header{};
    EncodeFrameHeader(h, header);
    Raw(header);
    if (!payload.empty()) Raw(payload);
  }
  // Exactly n bytes from the server, or fewer when it closed or went quiet.
  std::vector<uint8_t> Read(size_t n) {
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
  // True once the server closed the connection (reads until EOF or reset,
  // discarding what the server sent, e.g. its preamble).
  bool ClosedByServer() {
    uint8_t buf[4096];
    while (true) {
      const ssize_t r = recv(fd_, buf, sizeof(buf), 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class TcpAttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ContextOptions o;
    o.backend = "tcp";
    o.name = "target";
    server_ = Context::Open(o).value();
    auto writable = server_->Allocate(1 << 20, MemoryKind::kHost, RemoteAccess::kWrite);
    auto readable = server_->Allocate(1 << 20, MemoryKind::kHost, RemoteAccess::kRead);
    ASSERT_TRUE(writable.ok() && readable.ok());
    writable_ = std::move(*writable);
    readable_ = std::move(*readable);
    std::memset(writable_->data(), 0x11, writable_->size());
    std::memset(readable_->data(), 0x22, readable_->size());
    server_->SetHandler(7, [this](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t>) {
      from->Send(8, {1, 2, 3});
    });
    auto listener = server_->Listen("127.0.0.1", 0, [this](const std::shared_ptr<Endpoint>& ep) {
      if (authenticate_) ep->MarkAuthenticated();
    });
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(*listener);
  }

  // What a peer holding the description of `region` knows.
  static std::pair<uint32_t, RegionKey> KeyOf(const Region& region) {
    const std::vector<uint8_t> bytes = region.Describe();  // desc.key points into it
    auto desc = DecodeRegionDesc(bytes).value();
    return DecodeTcpKey(desc.key).value();
  }
  static FrameHeader PutTo(const Region& region, uint64_t offset, uint64_t len) {
    auto [id, key] = KeyOf(region);
    FrameHeader h;
    h.type = FrameType::kPut;
    h.region = id;
    h.key = key;
    h.addr = reinterpret_cast<uint64_t>(region.data()) + offset;
    h.length = len;
    h.op = 1;
    return h;
  }
  static bool Untouched(const Region& region, uint8_t fill) {
    const auto* p = static_cast<const uint8_t*>(region.data());
    return std::all_of(p, p + region.size(), [&](uint8_t b) { return b == fill; });
  }
  // A well-behaved peer still gets its answer.
  void ServerStillServes() {
    Attacker honest(listener_->port());
    ASSERT_TRUE(honest.connected());
    honest.Preamble();
    FrameHeader msg;
    msg.type = FrameType::kMessage;
    msg.msg_id = 7;
    honest.Frame(msg);
    const auto answer = honest.Read(kPreamble.size() + kFrameHeaderBytes + 3);
    ASSERT_EQ(answer.size(), kPreamble.size() + kFrameHeaderBytes + 3)
        << "no answer from the server after the attack";
    EXPECT_EQ(answer.back(), 3) << "the answer is not the handler's";
  }

  bool authenticate_ = false;
  std::unique_ptr<Context> server_;
  std::unique_ptr<Region> writable_, readable_;
  std::unique_ptr<Listener> listener_;
};

TEST_F(TcpAttackTest, ForgedKeyWritesNothing) {
  authenticate_ = true;
  Attacker a(listener_->port());
  ASSERT_TRUE(a.connected());
  a.Preamble();
  FrameHeader h = PutTo(*writable_, 0, 64);
  h.key[0] ^= 1;
  std::vector<uint8_t> evil(64, 0xee);
  a.Frame(h, evil);
  EXPECT_TRUE(a.ClosedByServer());
  EXPECT_TRUE(Untouched(*writable_, 0x11));
  ServerStillServes();
}

TEST_F(TcpAttackTest, RealKeyBeforeAuthenticationWritesNothing) {
  Attacker a(listener_->port());
  a.Preamble();
  std::vector<uint8_t> evil(64, 0xee);
  a.Frame(PutTo(*writable_, 0, 64), evil);
  EXPECT_TRUE(a.ClosedByServer());
  EXPECT_TRUE(Untouched(*writable_, 0x11));
  ServerStillServes();
}

TEST_F(TcpAttackTest, ReadOnlyMemoryIsNotWritableWithItsRealKey) {
  authenticate_ = true;
  Attacker a(listener_->port());
  a.Preamble();
  std::vector<uint8_t> evil(64, 0xee);
  a.Frame(PutTo(*readable_, 0, 64), evil);
  EXPECT_TRUE(a.ClosedByServer());
  EXPECT_TRUE(Untouched(*readable_, 0x22));
}

TEST_F(TcpAttackTest, WritesPastTheRegionWriteNothing) {
  authenticate_ = true;
  for (auto [offset, len] : {std::pair<uint64_t, uint64_t>{(1 << 20) - 8, 64},
                             {uint64_t{1} << 40, 8},
                             {0, ~uint64_t{0}},
                             {~uint64_t{0} - 4, 8}}) {
    Attacker a(listener_->port());
    a.Preamble();
    FrameHeader h = PutTo(*writable_, 0, len);
    h.addr += offset;
    a.Frame(h, std::vector<uint8_t>(64, 0xee));
    EXPECT_TRUE(a.ClosedByServer()) << offset << " +" << len;
  }
  EXPECT_TRUE(Untouched(*writable_, 0x11));
  ServerStillServes();
}

// UCX 1.13's connection manager aborted the whole process on these.
TEST_F(TcpAttackTest, GarbageClosesTheConnectionOnly) {
  const std::vector<std::vector<uint8_t>> payloads = {
      std::vector<uint8_t>(17, 0), std::vector<uint8_t>(4096, 0xff), std::vector<uint8_t>(8, 0xff)};
  for (const auto& garbage : payloads) {
    Attacker a(listener_->port());
    a.Raw(garbage);
    EXPECT_TRUE(a.ClosedByServer()) << garbage.size() << " bytes";
  }
  // After a good preamble: a frame of an unknown type.
  Attacker b(listener_->port());
  b.Preamble();
  b.Raw(std::vector<uint8_t>(kFrameHeaderBytes, 0xff));
  EXPECT_TRUE(b.ClosedByServer());
  ServerStillServes();
}

// A length announced is never allocated before it is checked.
TEST_F(TcpAttackTest, HugeAnnouncedMessageAllocatesNothing) {
  const long rss_before = testing::RssKiB();
  for (uint64_t len : {uint64_t{1} << 30, uint64_t{64} << 30, ~uint64_t{0}}) {
    Attacker a(listener_->port());
    a.Preamble();
    FrameHeader h;
    h.type = FrameType::kMessage;
    h.msg_id = 7;
    h.length = len;
    a.Frame(h);
    EXPECT_TRUE(a.ClosedByServer()) << len;
  }
  EXPECT_LT(testing::RssKiB() - rss_before, 16 * 1024) << "KiB grown";
  ServerStillServes();
}

// Answers the attacker never asked for are refused too.
TEST_F(TcpAttackTest, UnaskedAnswersCloseTheConnection) {
  authenticate_ = true;
  Attacker a(listener_->port());
  a.Preamble();
  FrameHeader h;
  h.type = FrameType::kGetData;
  h.op = 42;
  h.length = 1 << 20;
  a.Frame(h);
  EXPECT_TRUE(a.ClosedByServer());
  ServerStillServes();
}

}  // namespace
}  // namespace tessera::transport::tcp
