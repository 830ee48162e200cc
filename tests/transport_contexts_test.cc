// The transport contract for several contexts of one process opening and
// closing connections side by side: run for every backend the suite in
// transport_test.cc instantiates.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/test_util.h"
#include "tests/transport_fixture.h"

namespace tessera::transport {
namespace {

// Clients come and go from two threads, each a context of its own that
// connects, is answered and is destroyed, while the server closes its side
// of each as it goes and keeps answering the fixture's client. UCX before
// 1.18 kept an event for a socket one context had closed and delivered it
// against the socket another context opened next under the same number,
// aborting the whole process (transport/ucx/ucx_async_guard.h); CI saw it
// once in a server refusing one client while another connected.
TEST_P(TransportTest, ContextsComingAndGoingInOneProcessLeaveTheOthersWorking) {
  constexpr int kThreads = 2, kRounds = 40;
  std::atomic<int> connected{0}, finished{0};
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      struct Finish {
        std::atomic<int>& n;
        ~Finish() { n++; }
      } finish{finished};
      for (int i = 0; i < kRounds; ++i) {
        ContextOptions opts;
        opts.backend = GetParam().backend;
        opts.name = "coming-and-going-" + std::to_string(t);
        auto ctx = Context::Open(opts);
        if (!ctx.ok()) {
          failures[t] = ctx.status().ToString();
          return;
        }
        Waiter<Result<std::shared_ptr<Endpoint>>> done;
        (*ctx)->Connect(host_, listener_->port(), 10s, done.callback());
        auto ep = done.Wait();
        if (!ep.has_value() || !ep->ok()) {
          failures[t] = ep.has_value() ? ep->status().ToString() : "connect did not call back";
          return;
        }
        connected++;
        // Gone without a goodbye: the context closes what it has.
      }
    });
  }
  for (uint8_t echo = 0; finished.load() < kThreads; ++echo) {
    ep_->Send(kEchoMsg, {echo});
    if (NextReply() != std::vector<uint8_t>{echo}) {
      ADD_FAILURE() << "echo " << int{echo} << " was not answered";
      break;
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  EXPECT_EQ(connected.load(), kThreads * kRounds);
  ep_->Send(kEchoMsg, {42});
  EXPECT_EQ(NextReply(), (std::vector<uint8_t>{42})) << "the fixture's client lost its server";
}

}  // namespace
}  // namespace tessera::transport
