// When a server that an engine started is done: every worker came and left
// (saying bye, or lost), or none is left and the rest never came in time.
#include <gtest/gtest.h>

#include "server/worker_presence.h"
#include "tests/test_util.h"

namespace tessera::server {
namespace {

using namespace std::chrono_literals;
using Clock = WorkerPresence::Clock;

TEST(WorkerPresence, DoneOnceEveryWorkerCameAndLeft) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerPresence p(2, 60s, t0);
  EXPECT_FALSE(p.Verdict(t0)) << "nobody came yet, and the grace time has not passed";
  p.Connected(0, "/job:worker/task:0");
  p.Connected(1, "/job:worker/task:1");
  p.Connected(1, "/job:worker/task:1");  // a second connection of the same task
  p.Left(0, true, t0);
  EXPECT_FALSE(p.Verdict(t0));
  p.Left(1, true, t0);
  EXPECT_FALSE(p.Verdict(t0)) << "worker 1 still has a connection";
  p.Left(1, true, t0);
  auto v = p.Verdict(t0);
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->ok()) << *v;
}

TEST(WorkerPresence, ALostWorkerIsNamedUnlessItCameBack) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerPresence p(2, 60s, t0);
  p.Connected(0, "/job:worker/task:0");
  p.Connected(1, "/job:worker/task:1");
  p.Left(1, false, t0);                  // killed
  p.Connected(1, "/job:worker/task:1");  // restarted by the engine
  p.Left(1, true, t0);
  p.Left(0, false, t0);
  auto v = p.Verdict(t0);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->code(), StatusCode::kAborted);
  EXPECT_NE(v->message().find("/job:worker/task:0 left without saying bye"), std::string::npos)
      << *v;
  EXPECT_EQ(v->message().find("task:1"), std::string::npos) << *v;
}

TEST(WorkerPresence, WorkersThatNeverCameAreWaitedForThenNamed) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerPresence p(3, 60s, t0);
  p.Connected(0, "/job:worker/task:0");
  p.Left(0, true, t0);
  EXPECT_FALSE(p.Verdict(t0 + 59s));
  ASSERT_TRUE(p.NextCheck());
  EXPECT_EQ(*p.NextCheck(), t0 + 60s);
  auto v = p.Verdict(t0 + 60s);
  ASSERT_TRUE(v);
  EXPECT_NE(v->message().find("worker rank 1, 2 never connected"), std::string::npos) << *v;
  // One that comes in time resets the wait.
  WorkerPresence q(2, 60s, t0);
  q.Connected(0, "/job:worker/task:0");
  q.Left(0, true, t0);
  q.Connected(1, "/job:worker/task:1");
  EXPECT_FALSE(q.NextCheck());
  q.Left(1, true, t0 + 30s);
  auto w = q.Verdict(t0 + 30s);
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->ok()) << *w;
}

TEST(WorkerPresence, NoWorkerAtAllIsNamedAfterTheGraceTime) {
  const auto t0 = Clock::time_point{} + 1h;
  WorkerPresence p(1, 60s, t0);
  EXPECT_FALSE(p.Verdict(t0 + 59s));
  ASSERT_TRUE(p.NextCheck());
  auto v = p.Verdict(t0 + 60s);
  ASSERT_TRUE(v);
  EXPECT_NE(v->message().find("worker rank 0 never connected within 60 s of the start"),
            std::string::npos)
      << *v;
}

}  // namespace
}  // namespace tessera::server
