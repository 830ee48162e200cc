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

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>

#include "core/log.h"
#include "tests/test_util.h"
#include "transport/region_desc.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_region.h"
#include "transport/transport.h"

namespace tessera::transport::tcp {
namespace {

using namespace std::chrono_literals;

// A peer that speaks the tcp backend's framing by hand, breaking its rules.
class Attacker : public testing::RawTcpSocket {
 public:
  explicit Attacker(uint16_t port) : RawTcpSocket(port, std::chrono::seconds(20)) {}
  void Raw(std::span<const uint8_t> bytes) { Send(bytes); }
  void Preamble() { Raw(kPreamble); }
  void Frame(const FrameHeader& h, std::span<const uint8_t> payload = {}) {
    std::array<uint8_t, kFrameHeaderBytes> header{};
    EncodeFrameHeader(h, header);
    Raw(header);
    if (!payload.empty()) Raw(payload);
  }
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
    server_->SetHandler(7, [](const std::shared_ptr<Endpoint>& from, std::span<const uint8_t>) {
      from->Send(8, {1, 2, 3});
    });
    auto listener = server_->Listen("127.0.0.1", 0, [this](const std::shared_ptr<Endpoint>& ep) {
      if (authenticate_) ep->MarkAuthenticated();
      if (read_only_) ep->MarkReadOnly();
      std::lock_guard<std::mutex> lock(accepted_mu_);
      accepted_ = ep;
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
  static FrameHeader GetFrom(const Region& region, uint64_t offset, uint64_t len) {
    FrameHeader h = PutTo(region, offset, len);
    h.type = FrameType::kGet;
    return h;
  }
  // Byte `offset` of `region` as a one-sided get of another (authenticated)
  // peer reads it: the server's own thread reads the memory, which the test's
  // thread may not while that thread writes it.
  uint8_t ByteAt(const Region& region, uint64_t offset) {
    Attacker probe(listener_->port());
    probe.Preamble();
    probe.Frame(GetFrom(region, offset, 1));
    const auto answer = probe.Read(kPreamble.size() + kFrameHeaderBytes + 1);
    return answer.size() == kPreamble.size() + kFrameHeaderBytes + 1 ? answer.back() : 0;
  }
  // A put of `len` bytes whose region is freed once its first `first` bytes
  // landed, and (`map_again`) a region of the same size allocated at once,
  // where the freed one was as mmap tends to put it; then the rest is sent.
  void PutIntoARegionFreedMidway(size_t len, size_t first, bool map_again = true) {
    authenticate_ = true;
    auto region = server_->Allocate(len, MemoryKind::kHost, RemoteAccess::kReadWrite).value();
    std::memset(region->data(), 0x11, len);
    Attacker a(listener_->port());
    a.Preamble();
    a.Frame(PutTo(*region, 0, len), std::vector<uint8_t>(first, 0xee));
    ASSERT_TRUE(testing::WaitUntil([&] { return ByteAt(*region, first - 1) == 0xee; }, 20s))
        << "the first bytes of the put never landed";
    const void* freed_at = region->data();
    region.reset();
    if (!map_again) {
      a.Raw(std::vector<uint8_t>(len - first, 0xee));
      EXPECT_TRUE(a.ClosedByServer());
      ServerStillServes();
      return;
    }
    auto next = server_->Allocate(len, MemoryKind::kHost, RemoteAccess::kReadWrite).value();
    std::memset(next->data(), 0x33, len);
    a.Raw(std::vector<uint8_t>(len - first, 0xee));
    EXPECT_TRUE(a.ClosedByServer());
    EXPECT_TRUE(Untouched(*next, 0x33))
        << "the put went on into a region allocated since"
        << (next->data() == freed_at ? ", where the freed one was" : "");
    ServerStillServes();
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

  std::shared_ptr<Endpoint> Accepted() {
    std::lock_guard<std::mutex> lock(accepted_mu_);
    return accepted_;
  }

  std::atomic<bool> authenticate_{false}, read_only_{false};
  std::mutex accepted_mu_;
  std::shared_ptr<Endpoint> accepted_;  // the connection accepted last
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

// A put's region was checked once, at its header, and a raw pointer kept:
// a worker that let its connection's staging slot go (the shard unmapped
// it) and then sent the payload killed the ps task (SIGSEGV), or, once a
// tensor's arena was mapped at that address, wrote 4 MiB into the arena.
// Each piece of a put now finds its region again. A large put's payload
// goes straight from the socket into the region; a small one's is copied
// from the read buffer: both ways.
TEST_F(TcpAttackTest, APutIntoARegionFreedMidwayWritesNothingMore) {
  PutIntoARegionFreedMidway(4 << 20, 64 << 10);
}
TEST_F(TcpAttackTest, ASmallPutIntoARegionFreedMidwayWritesNothingMore) {
  PutIntoARegionFreedMidway(8 << 10, 1 << 10);
}
TEST_F(TcpAttackTest, APutIntoARegionFreedMidwayLeavesTheServerAlive) {
  PutIntoARegionFreedMidway(8 << 10, 1 << 10, /*map_again=*/false);
  PutIntoARegionFreedMidway(4 << 20, 64 << 10, /*map_again=*/false);
}

// A get's answer was queued as a raw pointer into its region: freed while the
// answer waited for the socket, the region was read after it was gone, or
// another region mapped there since was sent to the peer.
TEST_F(TcpAttackTest, AGetFromARegionFreedMidwayReadsNothingMore) {
  authenticate_ = true;
  constexpr size_t kLen = 64 << 20;  // far more than the sockets' buffers hold
  auto region = server_->Allocate(kLen, MemoryKind::kHost, RemoteAccess::kRead).value();
  std::memset(region->data(), 0x22, kLen);
  Attacker a(listener_->port());
  a.Preamble();
  a.Frame(GetFrom(*region, 0, kLen));
  // Nothing is read until the region is gone: the answer fills the sockets'
  // buffers and waits.
  ASSERT_TRUE(
      testing::WaitUntil([&] { return a.Unread() > kPreamble.size() + kFrameHeaderBytes; }, 20s))
      << "the answer never began";
  const void* freed_at = region->data();
  region.reset();
  auto next = server_->Allocate(kLen, MemoryKind::kHost, RemoteAccess::kRead).value();
  std::memset(next->data(), 0x5a, kLen);  // another tensor's values
  const std::vector<uint8_t> rest = a.Read(kLen);
  EXPECT_LT(rest.size(), kLen) << "the whole answer was sent";
  EXPECT_EQ(std::count(rest.begin(), rest.end(), 0x5a), 0)
      << "bytes of a region allocated since were sent"
      << (next->data() == freed_at ? ", where the freed one was" : "");
  EXPECT_TRUE(a.ClosedByServer());
  ServerStillServes();
}

// A staging slot's key is its connection's: a reader holding a captured key
// wrote into a worker's slot, and the worker's +1.0 was applied as -1000.
TEST_F(TcpAttackTest, ARegionBoundToAConnectionTakesWritesFromItOnly) {
  authenticate_ = true;
  auto slot = server_->Allocate(4096, MemoryKind::kHost, RemoteAccess::kWrite).value();
  std::memset(slot->data(), 0x11, slot->size());
  Attacker owner(listener_->port());
  owner.Preamble();
  // The server's side of `owner`: the connection accepted last.
  ASSERT_TRUE(testing::WaitUntil([&] { return Accepted() != nullptr; }, 20s));
  ASSERT_TRUE(slot->TakeWritesOnlyFrom(*Accepted()).ok());
  Attacker thief(listener_->port());
  thief.Preamble();
  thief.Frame(PutTo(*slot, 0, 64), std::vector<uint8_t>(64, 0xee));
  EXPECT_TRUE(thief.ClosedByServer());
  EXPECT_TRUE(Untouched(*slot, 0x11)) << "another connection wrote the bound region";
  owner.Frame(PutTo(*slot, 0, 64), std::vector<uint8_t>(64, 0x77));
  const auto done = owner.Read(kPreamble.size() + kFrameHeaderBytes);
  EXPECT_EQ(done.size(), kPreamble.size() + kFrameHeaderBytes) << "the owner's put was refused";
  ServerStillServes();
}

// Readers and observers may read one-sided, never write, with any key.
TEST_F(TcpAttackTest, AReadOnlyPeerWritesNothing) {
  authenticate_ = true;
  read_only_ = true;
  Attacker reader(listener_->port());
  reader.Preamble();
  reader.Frame(GetFrom(*readable_, 0, 8));
  EXPECT_EQ(reader.Read(kPreamble.size() + kFrameHeaderBytes + 8).size(),
            kPreamble.size() + kFrameHeaderBytes + 8)
      << "a read-only peer could not read";
  reader.Frame(PutTo(*writable_, 0, 64), std::vector<uint8_t>(64, 0xee));
  EXPECT_TRUE(reader.ClosedByServer());
  EXPECT_TRUE(Untouched(*writable_, 0x11));
  read_only_ = false;
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

// Each broken connection was a WARN line: a stranger could flood the log as
// fast as it connects. Now at most 10 a minute are written, and the next one
// says how many were held back.
TEST_F(TcpAttackTest, StrangersCannotFloodTheLog) {
  // The sink list is changed on the server's loop thread, the only one
  // that logs here, so that no line is being written meanwhile.
  auto on_loop = [&](const std::function<void()>& change) {
    testing::Waiter<bool> changed;
    server_->Post([&change, done = changed.callback()] {
      change();
      done(true);
    });
    ASSERT_TRUE(changed.Wait().has_value());
  };
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  on_loop([&] { Logger().sinks().push_back(sink); });
  for (int i = 0; i < 50; ++i) {
    Attacker a(listener_->port());
    a.Raw(std::vector<uint8_t>(17, 0));
    ASSERT_TRUE(a.ClosedByServer());
  }
  on_loop([&] { Logger().sinks().pop_back(); });
  const std::string text = log.str();
  size_t lines = 0;
  for (size_t at = text.find("closing the connection"); at != std::string::npos;
       at = text.find("closing the connection", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 10u) << text;
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
