// What a client's start and its coordinator calls wait for
// (client/startup_waiter.h, client/coordinator_reach.h), without sockets.
// Each case's outcome is decided by what was reported, never by timing:
// deadlines are either past or far off.

#include <gtest/gtest.h>

#include <thread>

#include "client/coordinator_reach.h"
#include "client/startup_waiter.h"

namespace tessera::client {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kFarOff = std::chrono::minutes(5);

StartupWaiter::Options WaitOptions(Clock::time_point deadline) {
  return {.task = "/job:worker/task:0",
          .deadline = deadline,
          .startup_timeout = std::chrono::milliseconds(1234),
          .report_interval = std::chrono::milliseconds(0),
          .interrupted = nullptr};
}

TEST(StartupWaiterTest, EndsWhenEveryTaskWelcomedTheClient) {
  StartupWaiter waiter({"ps 0", "ps 1"});
  waiter.Welcomed(0);
  std::thread loop([&] {
    waiter.Retrying(1, "connection refused");
    waiter.Welcomed(1);
  });
  EXPECT_TRUE(waiter.Wait(WaitOptions(Clock::now() + kFarOff)).ok());
  loop.join();
}

TEST(StartupWaiterTest, ATaskThatRefusedForGoodEndsItAtOnceNamingIt) {
  StartupWaiter waiter({"ps 0", "ps 1"});
  waiter.Welcomed(0);
  waiter.Failed(1, Status::PermissionDenied("the proof does not match"));
  Status st = waiter.Wait(WaitOptions(Clock::now() + kFarOff));
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("ps 1: the proof does not match"), std::string::npos)
      << st.ToString();
  EXPECT_EQ(st.message().find("ps 0"), std::string::npos) << st.ToString();
}

TEST(StartupWaiterTest, TheDeadlineNamesEachTaskMissingWithItsLastError) {
  StartupWaiter waiter({"ps 0", "ps 1", "ps 2"});
  waiter.Welcomed(0);
  waiter.Retrying(1, "connection refused");
  Status st = waiter.Wait(WaitOptions(Clock::now() - std::chrono::seconds(1)));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("within 1234 ms"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("ps 1: connection refused"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("ps 2: no answer yet"), std::string::npos) << st.ToString();
}

TEST(StartupWaiterTest, AnInterruptedCallerStopsWaiting) {
  StartupWaiter waiter({"ps 0"});
  auto options = WaitOptions(Clock::now() + kFarOff);
  options.interrupted = [] { return true; };
  Status st = waiter.Wait(options);
  EXPECT_EQ(st.code(), StatusCode::kCancelled);
  EXPECT_NE(st.message().find("ps 0"), std::string::npos) << st.ToString();
}

TEST(CoordinatorReachTest, AnErrorFromACoordinatorNotLostSinceIsItsOwn) {
  CoordinatorReach reach;
  reach.Note(true);
  EXPECT_EQ(reach.WaitForReturn(reach.reached(), Clock::now() + kFarOff),
            CoordinatorReach::Wait::kItSaidSo);
}

TEST(CoordinatorReachTest, ALostCoordinatorIsWaitedForUntilItIsBack) {
  CoordinatorReach reach;
  reach.Note(true);
  const uint64_t before = reach.reached();
  reach.Note(false);
  std::thread loop([&] { reach.Note(true); });
  EXPECT_EQ(reach.WaitForReturn(before, Clock::now() + kFarOff), CoordinatorReach::Wait::kBack);
  loop.join();
}

TEST(CoordinatorReachTest, ALostCoordinatorNotBackByTheDeadlineTimesOut) {
  CoordinatorReach reach;
  reach.Note(true);
  const uint64_t before = reach.reached();
  reach.Note(false);
  EXPECT_EQ(reach.WaitForReturn(before, Clock::now() - std::chrono::seconds(1)),
            CoordinatorReach::Wait::kTimedOut);
}

TEST(CoordinatorReachTest, ClosingReleasesEveryWaiter) {
  CoordinatorReach reach;
  const uint64_t before = reach.reached();  // never reached
  CoordinatorReach::Wait seen = CoordinatorReach::Wait::kItSaidSo;
  std::thread waiter([&] { seen = reach.WaitForReturn(before, Clock::now() + kFarOff); });
  reach.Close();
  waiter.join();
  EXPECT_EQ(seen, CoordinatorReach::Wait::kClosing);
  EXPECT_EQ(reach.WaitForReturn(before, Clock::now() + kFarOff), CoordinatorReach::Wait::kClosing);
}

}  // namespace
}  // namespace tessera::client
