// Which worker ranks a sync step may still wait for: connected ones, and
// departed ones for the rejoin grace time; a rank with a second connection
// has not departed when one of them ends.
#include <gtest/gtest.h>

#include "server/worker_roster.h"

namespace tessera::server {
namespace {

using namespace std::chrono_literals;
using Clock = WorkerRoster::Clock;

TEST(WorkerRoster, ARankDepartsWithItsLastConnectionAndIsAwaitedForTheGraceTime) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerRoster roster(10s);
  roster.Joined(1);
  roster.Joined(1);  // a second connection of the same task
  EXPECT_FALSE(roster.Left(1, "/job:worker/task:1", t0)) << "it has another connection";
  EXPECT_EQ(roster.departures(), 0u);
  EXPECT_TRUE(roster.Left(1, "/job:worker/task:1", t0));
  EXPECT_EQ(roster.departures(), 1u);
  std::string gone;
  EXPECT_TRUE(roster.MayStillPush(1, t0 + 9s, &gone)) << "within the grace time";
  EXPECT_TRUE(gone.empty());
  EXPECT_FALSE(roster.MayStillPush(1, t0 + 10s, &gone));
  EXPECT_EQ(gone, "/job:worker/task:1");
  EXPECT_TRUE(roster.MayStillPush(0, t0 + 1h, nullptr)) << "a rank that never left";
}

TEST(WorkerRoster, ARestartedWorkerIsBackAndNoLongerAwaited) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerRoster roster(10s);
  roster.Joined(0);
  ASSERT_TRUE(roster.Left(0, "/job:worker/task:0", t0));
  ASSERT_EQ(roster.NextRejoinDeadline(t0), t0 + 10s);
  roster.Joined(0);
  EXPECT_FALSE(roster.NextRejoinDeadline(t0)) << "nobody is awaited";
  EXPECT_TRUE(roster.MayStillPush(0, t0 + 1h, nullptr));
}

TEST(WorkerRoster, TheEarliestDeadlineIsNextAndAPassedOneIsNot) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerRoster roster(10s);
  roster.Joined(0);
  roster.Joined(1);
  ASSERT_TRUE(roster.Left(1, "/job:worker/task:1", t0 + 3s));
  ASSERT_TRUE(roster.Left(0, "/job:worker/task:0", t0));
  EXPECT_EQ(roster.NextRejoinDeadline(t0 + 4s), t0 + 10s);
  EXPECT_EQ(roster.NextRejoinDeadline(t0 + 10s), t0 + 13s) << "rank 0's has passed";
  EXPECT_FALSE(roster.NextRejoinDeadline(t0 + 13s));
}

TEST(WorkerRoster, AnEndOfAConnectionItNeverCountedIsNoDeparture) {
  WorkerRoster roster(10s);
  EXPECT_FALSE(roster.Left(3, "/job:worker/task:3", Clock::now()));
  EXPECT_EQ(roster.departures(), 0u);
}

}  // namespace
}  // namespace tessera::server
