// Liveness without timing: the silence meter's arithmetic on a made-up clock,
// the timeouts read from the environment, and the spin's give-up rule.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "client/silence_meter.h"
#include "core/spin.h"
#include "core/timeouts.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using Clock = SilenceMeter::Clock;

// Heartbeats every second, dead after 5 s of silence, a tick counts 2 s at most.
class SilenceMeterTest : public ::testing::Test {
 protected:
  SilenceMeter meter_{5000ms, 2000ms};
  Clock::time_point t0_ = Clock::time_point(1h);
};

TEST_F(SilenceMeterTest, APeerThatAnswersIsNeverDead) {
  meter_.Reset(t0_);
  for (int i = 1; i <= 100; ++i) {
    const auto now = t0_ + i * 1s;
    EXPECT_FALSE(meter_.Tick(now, now - 10ms)) << "tick " << i;
  }
  EXPECT_EQ(meter_.silent(), 10ms);
}

TEST_F(SilenceMeterTest, ASilentPeerIsDeadAfterTheTimeoutOfListening) {
  meter_.Reset(t0_);
  const auto heard = t0_;
  for (int i = 1; i <= 5; ++i) EXPECT_FALSE(meter_.Tick(t0_ + i * 1s, heard)) << "tick " << i;
  EXPECT_TRUE(meter_.Tick(t0_ + 6s, heard));
  EXPECT_EQ(meter_.silent(), 6000ms);
}

// This process was held up for 30 s (a long registration, emulation): the
// peer's answers were queued meanwhile and are seen on the next tick.
TEST_F(SilenceMeterTest, OwnStallWithTheAnswersQueuedIsNotSilence) {
  meter_.Reset(t0_);
  EXPECT_FALSE(meter_.Tick(t0_ + 1s, t0_ + 900ms));
  EXPECT_FALSE(meter_.Tick(t0_ + 31s, t0_ + 31s - 1ms));
}

// The same stall, and the peer had nothing to say in it (nobody asked it
// anything): the stall counts only as much as a late tick may, 2 s.
TEST_F(SilenceMeterTest, OwnStallCountsAtMostTheMaximumGap) {
  meter_.Reset(t0_);
  EXPECT_FALSE(meter_.Tick(t0_ + 1s, t0_ + 900ms));  // 100 ms silent
  EXPECT_FALSE(meter_.Tick(t0_ + 31s, t0_ + 900ms));
  EXPECT_EQ(meter_.silent(), 2100ms);
  // Silence that goes on while listening still ends in a verdict.
  EXPECT_FALSE(meter_.Tick(t0_ + 32s, t0_ + 900ms));
  EXPECT_FALSE(meter_.Tick(t0_ + 33s, t0_ + 900ms));
  EXPECT_TRUE(meter_.Tick(t0_ + 34s, t0_ + 900ms));
  EXPECT_EQ(meter_.silent(), 5100ms);
}

TEST_F(SilenceMeterTest, TrafficOfAnyKindResetsTheCount) {
  meter_.Reset(t0_);
  EXPECT_FALSE(meter_.Tick(t0_ + 1s, t0_));
  EXPECT_FALSE(meter_.Tick(t0_ + 2s, t0_));
  EXPECT_FALSE(meter_.Tick(t0_ + 3s, t0_));
  EXPECT_FALSE(meter_.Tick(t0_ + 4s, t0_ + 3500ms));  // e.g. a put completed
  EXPECT_EQ(meter_.silent(), 500ms);
  for (int i = 5; i <= 8; ++i) EXPECT_FALSE(meter_.Tick(t0_ + i * 1s, t0_ + 3500ms)) << i;
  EXPECT_TRUE(meter_.Tick(t0_ + 9s, t0_ + 3500ms));
}

class TimeoutEnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("TESSERA_TIMEOUT_SCALE");
    unsetenv("TESSERA_TEST_TIMEOUT_MS");
  }
};

TEST_F(TimeoutEnvTest, ConfiguredUnlessSetScaledEitherWay) {
  unsetenv("TESSERA_TIMEOUT_SCALE");
  EXPECT_EQ(TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 5000ms).value(), 5000ms);
  setenv("TESSERA_TEST_TIMEOUT_MS", "1500", 1);
  EXPECT_EQ(TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 5000ms).value(), 1500ms);
  setenv("TESSERA_TIMEOUT_SCALE", "10", 1);
  EXPECT_EQ(TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 5000ms).value(), 15000ms);
  unsetenv("TESSERA_TEST_TIMEOUT_MS");
  EXPECT_EQ(TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 5000ms).value(), 50000ms);
  EXPECT_EQ(TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 0ms).value(), 0ms) << "off stays off";
}

TEST_F(TimeoutEnvTest, BadValuesAreErrorsNamingTheVariable) {
  for (const char* bad : {"abc", "-1", "5s", "1e99", "nan"}) {
    setenv("TESSERA_TEST_TIMEOUT_MS", bad, 1);
    auto r = TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 5000ms);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("TESSERA_TEST_TIMEOUT_MS"), std::string::npos);
  }
  unsetenv("TESSERA_TEST_TIMEOUT_MS");
  for (const char* bad : {"0", "-2", "x", "1001"}) {
    setenv("TESSERA_TIMEOUT_SCALE", bad, 1);
    auto r = TimeoutFromEnv("TESSERA_TEST_TIMEOUT_MS", 5000ms);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("TESSERA_TIMEOUT_SCALE"), std::string::npos);
  }
}

// A spin gives up once it sees that its thread was not running for longer
// than an idle poll could take; a sleep stands in for being descheduled.
TEST(SpinWindow, StopsOnceDescheduled) {
  SpinWindow spin(std::chrono::seconds(10));
  std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(spin.Continue());
  EXPECT_TRUE(spin.descheduled());
}

TEST(SpinWindow, EndsWhenTheWindowHasPassed) {
  SpinWindow spin(std::chrono::nanoseconds(0));
  EXPECT_FALSE(spin.Continue());
}

}  // namespace
}  // namespace tessera
