// A party on the path between a worker and its shard, without the secret
// (hardening round two, finding 3): a relay that flips one byte of a push.
// With session protection on, the shard must end the session naming an
// integrity failure, and the tampered gradient must never be applied; with
// it off, the same flip goes in unnoticed, which is the threat (and shows
// the relay reaches the payload). Both sides' choices decide the session's
// protection, and a worker that asks for it refuses a shard that will not.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

#include "core/log.h"
#include "tests/cluster_fixture.h"
#include "tests/flipping_relay.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kValues = 256 * 1024;  // a 1 MiB push: through the staging slot

class OnPathTest : public ::testing::Test, public testing::ClusterFixture {
 protected:
  // One shard, listening on its own port; the spec, which the worker
  // connects by, names the relay's.
  void Start(SessionProtection shard_side) {
    const auto ports = testing::UnusedPorts(2);
    const uint16_t shard_port = ports[0];
    relay_ = std::make_unique<testing::FlippingRelay>(shard_port);
    ASSERT_TRUE(spec_.AddJob("ps", {{host_, relay_->port()}}).ok());
    ASSERT_TRUE(spec_.AddJob("worker", {{host_, ports[1]}}).ok());
    configure_server_ = [=](ServerOptions& o) {
      o.bind_port = shard_port;
      o.session_protection = shard_side;
    };
    // Lines the shard logs, read by the cases (added before any thread logs).
    Logger().sinks().push_back(sink_);
    StartServers(1);
  }
  void TearDown() override {
    StopCluster();
    if (!Logger().sinks().empty() && Logger().sinks().back() == sink_) Logger().sinks().pop_back();
  }

  // Pushes ones into a zeroed tensor with a byte of the push flipped on the
  // way; returns what a pull reads afterwards.
  std::vector<float> PushThroughTheRelay(SessionProtection worker_side, bool* protected_session) {
    ClientOptions o = Options(0);
    o.session_protection = worker_side;
    o.op_timeout = 10s;
    Client& c = Connect(o);
    *protected_session = c.counters().protected_sessions > 0;
    auto w = c.Declare(F32("w", kValues));
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(c.Initialize().ok());
    std::vector<float> ones(kValues, 1.0f);
    relay_->Arm(64 * 1024);  // well inside the push's megabyte
    Status pushed = c.Push({PushItem::Of<float>(*w, ones)});
    EXPECT_TRUE(relay_->flipped()) << "the relay never saw the byte it was to flip";
    // A session the shard ended is set up again by the client: the pull
    // waits for that.
    std::vector<float> got(kValues, -1.0f);
    Status pulled;
    EXPECT_TRUE(testing::WaitUntil(
        [&] { return (pulled = c.Pull({PullItem::Of<float>(*w, got)})).ok(); }, 20s))
        << pulled << " (the push said: " << pushed << ")";
    return got;
  }

  // The push was refused whole (and issued again on a new connection, or
  // failed): every value is what an untampered push gives, or untouched.
  static void ExpectNothingTamperedApplied(const std::vector<float>& got) {
    const bool all_ones = got == std::vector<float>(kValues, 1.0f);
    const bool all_zeros = got == std::vector<float>(kValues, 0.0f);
    EXPECT_TRUE(all_ones || all_zeros) << "a tampered value was applied";
  }
  void ExpectTheShardNamedTheIntegrityFailure() const {
    EXPECT_NE(log_.str().find("failed its integrity check"), std::string::npos)
        << "the shard did not name the integrity failure; its log:\n"
        << log_.str();
  }

  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_ =
      std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
  std::unique_ptr<testing::FlippingRelay> relay_;
};

TEST_F(OnPathTest, AFlippedByteEndsAProtectedSessionAndIsNeverApplied) {
  Start(SessionProtection::kOn);
  bool protected_session = false;
  auto got = PushThroughTheRelay(SessionProtection::kAuto, &protected_session);
  EXPECT_TRUE(protected_session);
  ExpectNothingTamperedApplied(got);
  ExpectTheShardNamedTheIntegrityFailure();
}

TEST_F(OnPathTest, AFlippedByteEndsAnAuthenticatedSessionAndIsNeverApplied) {
  Start(SessionProtection::kIntegrity);  // authenticated, not encrypted
  bool protected_session = false;
  auto got = PushThroughTheRelay(SessionProtection::kAuto, &protected_session);
  EXPECT_TRUE(protected_session);
  ExpectNothingTamperedApplied(got);
  ExpectTheShardNamedTheIntegrityFailure();
}

TEST_F(OnPathTest, WithoutProtectionTheFlippedByteIsApplied) {
  Start(SessionProtection::kOff);
  bool protected_session = true;
  auto got = PushThroughTheRelay(SessionProtection::kAuto, &protected_session);
  EXPECT_FALSE(protected_session);
  size_t altered = 0;
  for (float v : got) altered += v != 1.0f;
  EXPECT_EQ(altered, 1u) << "the flip should alter exactly one value, unnoticed";
}

TEST_F(OnPathTest, AWorkerAskingForProtectionGetsItFromAShardLeftOnAuto) {
  Start(SessionProtection::kAuto);  // loopback: off unless asked
  bool protected_session = false;
  auto got = PushThroughTheRelay(SessionProtection::kOn, &protected_session);
  EXPECT_TRUE(protected_session);
  ExpectNothingTamperedApplied(got);
}

TEST_F(OnPathTest, AWorkerAskingForProtectionGetsItFromAShardThatSwitchedItOff) {
  Start(SessionProtection::kOff);
  bool protected_session = false;
  auto got = PushThroughTheRelay(SessionProtection::kOn, &protected_session);
  EXPECT_TRUE(protected_session);
  ExpectNothingTamperedApplied(got);
}

}  // namespace
}  // namespace tessera
