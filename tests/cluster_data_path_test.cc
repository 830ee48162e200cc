// How bytes move: one-sided or inline, in parts through the staging slot,
// and pulls that never see half an update.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/secret.h"
#include "core/timeouts.h"
#include "kernels/update.h"
#include "tessera/client.h"
#include "tessera/server.h"
#include "tests/cluster_fixture.h"
#include "tests/test_util.h"
#include "tools/cpu_hog.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

using testing::ClusterTest;
using testing::RawPeer;
using testing::ShardProcesses;

TEST_P(ClusterTest, LargeTensorMovesOneSided) {
  StartCluster(1, 1);
  auto opts = Options(0);
  opts.chunk_bytes = 4u << 20;  // the default: 16 chunks, each one put and one get
  auto cr = Client::Connect(opts);
  ASSERT_TRUE(cr.ok());
  Client& c = **cr;
  const size_t n = (64u << 20) / 4;
  auto w = c.Declare({"big", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAssign, {}, -1});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> data(n), back(n);
  std::iota(data.begin(), data.end(), 0.5f);
  auto before = c.counters();
  ASSERT_TRUE(c.Push({PushItem::Of<float>(*w, data)}).ok());
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, back, 2)}).ok());
  auto after = c.counters();
  EXPECT_TRUE(data == back);
  EXPECT_EQ(after.put_bytes - before.put_bytes, n * 4) << "payload went one-sided, once";
  EXPECT_EQ(after.get_bytes - before.get_bytes, n * 4);
  EXPECT_EQ(after.puts - before.puts, 16u);
  EXPECT_EQ(after.gets - before.gets, 16u);
  EXPECT_LT(after.message_bytes_sent - before.message_bytes_sent, 2048u)
      << "no payload in messages";
  EXPECT_LT(after.message_bytes_received - before.message_bytes_received, 2048u);
}

// Small pushes and pulls carry their bytes in the messages (one round trip,
// no put, get, flush or lease); a batch above inline_bytes goes one-sided.
TEST_P(ClusterTest, SmallTensorsTravelInline) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  auto t = c.DeclareMany({F32("a", 3), F32("b", 500), F32("big", 4096)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> a = {1, 2, 3}, b(500, 0.5f), big(4096, 2.0f), ga(3), gb(500), gbig(4096);
  auto before = c.counters();
  ASSERT_TRUE(c.Push({PushItem::Of<float>((*t)[0], a), PushItem::Of<float>((*t)[1], b)}).ok());
  ASSERT_TRUE(
      c.Pull({PullItem::Of<float>((*t)[0], ga, 2), PullItem::Of<float>((*t)[1], gb, 2)}).ok());
  auto after = c.counters();
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
  EXPECT_EQ(after.puts, before.puts) << "2012 bytes travel inline";
  EXPECT_EQ(after.gets, before.gets);
  EXPECT_GT(after.message_bytes_sent - before.message_bytes_sent, 2012u);
  ASSERT_TRUE(c.Push({PushItem::Of<float>((*t)[2], big)}).ok());  // 16 KiB: one-sided
  ASSERT_TRUE(c.Pull({PullItem::Of<float>((*t)[2], gbig, 2)}).ok());
  EXPECT_EQ(gbig, big);
  auto last = c.counters();
  EXPECT_EQ(last.puts - after.puts, 1u);
  EXPECT_EQ(last.gets - after.gets, 1u);
}

// Small tensors above the inline limit go one-sided; where the fabric says a
// put or get costs more than a copy (GatherUpTo), the ones next to each
// other in the staging slot are gathered into one put, and the ones next to
// each other in the shard's arena come back in one get. Every byte must
// still land where its own tensor's entry says, padding and all: sizes that
// are not a multiple of the 64-byte alignment, a large tensor that breaks
// the run, a second push that adds to the first, and pulls that leave
// tensors out of the run or ask for them backwards.
TEST_P(ClusterTest, SmallTensorsAboveTheInlineLimitArriveWhole) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 41; ++i) {
    const int64_t n = i == 20 ? 16384 : i < 20 ? 1001 : 1024;  // 4004 B, 64 KiB, 4 KiB
    specs.push_back(F32("t" + std::to_string(i), n));
  }
  auto t = c.DeclareMany(specs);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<std::vector<float>> grads(specs.size()), back(specs.size());
  std::vector<PushItem> push;
  std::vector<PullItem> pull;
  for (size_t i = 0; i < specs.size(); ++i) {
    grads[i].resize(static_cast<size_t>(specs[i].shape[0]));
    for (size_t k = 0; k < grads[i].size(); ++k) grads[i][k] = static_cast<float>(i * 10000 + k);
    back[i].resize(grads[i].size());
    push.push_back(PushItem::Of<float>((*t)[i], grads[i]));
    pull.push_back(PullItem::Of<float>((*t)[i], back[i], 2));
  }
  auto before = c.counters();
  ASSERT_TRUE(c.Push(push).ok());
  auto after = c.counters();
  ASSERT_TRUE(c.Push(push).ok());
  auto pushed = c.counters();
  ASSERT_TRUE(c.Pull(pull).ok());
  auto pulled = c.counters();
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], 2 * grads[i][k]) << "tensor " << i << ", element " << k;
    }
  }
  // Every third tensor (the gaps between them are read and dropped), then
  // all of them backwards (no run at all), into poisoned buffers.
  std::vector<PullItem> thirds, backwards;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::fill(back[i].begin(), back[i].end(), -1.0f);
    if (i % 3 == 0) thirds.push_back(pull[i]);
  }
  ASSERT_GE(thirds.size() * 4000, ClientOptions{}.inline_bytes) << "the pull must go one-sided";
  ASSERT_TRUE(c.Pull(thirds).ok());
  auto pulled_thirds = c.counters();
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], i % 3 == 0 ? 2 * grads[i][k] : -1.0f)
          << "every third tensor: tensor " << i << ", element " << k;
    }
    std::fill(back[i].begin(), back[i].end(), -1.0f);
  }
  backwards.assign(pull.rbegin(), pull.rend());
  ASSERT_TRUE(c.Pull(backwards).ok());
  auto pulled_backwards = c.counters();
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], 2 * grads[i][k]) << "backwards: tensor " << i << ", element " << k;
    }
  }
  const uint64_t all_gets = pulled.gets - pushed.gets;
  const uint64_t thirds_gets = pulled_thirds.gets - pulled.gets;
  const uint64_t backwards_gets = pulled_backwards.gets - pulled_thirds.gets;
  if (std::string(GetParam()) == "native") {
    // Tessera's sockets gather chunks up to 16 KiB: the first run, the
    // large tensor alone, the second run; for every third tensor the large
    // one's gap breaks the run in two.
    EXPECT_EQ(after.puts - before.puts, 3u);
    EXPECT_EQ(all_gets, 3u);
    EXPECT_EQ(thirds_gets, 2u);
  } else {
    EXPECT_EQ(after.puts - before.puts, specs.size()) << "UCX puts each chunk where it is";
    EXPECT_EQ(all_gets, specs.size()) << "UCX gets each chunk where it is";
    EXPECT_EQ(thirds_gets, thirds.size());
  }
  EXPECT_EQ(backwards_gets, specs.size()) << "chunks asked for backwards form no run";
}

// A push larger than the worker's staging slot on a shard (16 MiB here)
// goes in parts, one after another, each within the slot: every tensor
// arrives whole, and the sync step counts once, whatever the parts.
TEST_P(ClusterTest, APushLargerThanTheStagingSlotGoesInParts) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 7; ++i) {
    specs.push_back(F32("t" + std::to_string(i), i == 3 ? 1000 : (1 << 20) - 16 * i));
    specs.back().mode = ConsistencyMode::Sync(1, 1, /*average=*/false);
  }
  auto t = c.DeclareMany(specs);  // about 24 MiB: two parts
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<std::vector<float>> grads(specs.size()), back(specs.size());
  std::vector<PushItem> push;
  std::vector<PullItem> pull;
  for (size_t i = 0; i < specs.size(); ++i) {
    grads[i].resize(static_cast<size_t>(specs[i].shape[0]));
    for (size_t k = 0; k < grads[i].size(); ++k) grads[i][k] = static_cast<float>(i * 7 + k % 1000);
    back[i].resize(grads[i].size());
    push.push_back(PushItem::Of<float>((*t)[i], grads[i]));
    pull.push_back(PullItem::Of<float>((*t)[i], back[i]));
  }
  for (uint64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(c.Push(push, {.step = step}).ok()) << "step " << step;
    for (auto& p : pull) p.min_step = step + 1;
    ASSERT_TRUE(c.Pull(pull).ok()) << "step " << step;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < grads[i].size(); ++k) {
      ASSERT_EQ(back[i][k], 2 * grads[i][k]) << "tensor " << i << ", element " << k;
    }
  }
  EXPECT_EQ(EventualGlobalStep(c, 2), 2u);
}

TEST_P(ClusterTest, ChunksLargerThanTheStagingSlotAreRefusedAtConnect) {
  StartCluster(1, 1);
  auto opts = Options(0);
  opts.chunk_bytes = 64u << 20;  // the shards' slots hold 16 MiB
  auto c = Client::Connect(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("chunk_bytes"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("staging"), std::string::npos) << c.status().ToString();
}

// Each update adds 1 to every element, so any pulled buffer must be uniform:
// a mix of two values would be a half-applied update.
TEST_P(ClusterTest, PullNeverSeesAHalfAppliedUpdate) {
  StartCluster(1, 2);
  Client& writer = Connect(0);
  Client& reader = Connect(1);
  const size_t n = (2u << 20) / 4;
  auto w = writer.Declare({"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1});
  auto r = reader.Declare({"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1});
  ASSERT_TRUE(w.ok() && r.ok());
  ASSERT_TRUE(writer.Initialize().ok());
  ASSERT_TRUE(reader.WaitForInit(5s).ok());
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::vector<float> ones(n, 1.0f);
    while (!stop) ASSERT_TRUE(writer.Push({PushItem::Of<float>(*w, ones)}).ok());
  });
  // Pulls until 50 of them found the weights changed since the pull before
  // (pushes were applied between and beside them), however fast this build
  // runs; a bounded number.
  std::vector<float> got(n);
  int torn = 0, changed = 0;
  float last = -1.0f;
  for (int i = 0; i < 5000 && changed < 50; ++i) {
    ASSERT_TRUE(reader.Pull({PullItem::Of<float>(*r, got)}).ok());
    if (std::any_of(got.begin(), got.end(), [&](float x) { return x != got[0]; })) torn++;
    if (i > 0 && got[0] != last) changed++;
    last = got[0];
  }
  stop = true;
  pusher.join();
  EXPECT_EQ(changed, 50) << "the pushes did not go on beside the pulls";
  EXPECT_EQ(torn, 0);
}

TEST_P(ClusterTest, LostShardFailsCallsNamingIt) {
  StartCluster(2, 1);
  Client& c = Connect(0);
  auto t = c.DeclareMany({F32("a", 4), F32("b", 4)});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c.Initialize().ok());
  servers_[1]->Stop();
  std::vector<float> v(4), got(4);
  Status st;
  for (int i = 0; i < 50; ++i) {  // the loss may take a moment to be noticed
    st = c.Push({PushItem::Of<float>((*t)[1], v)});
    if (!st.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/job:ps/task:1"), std::string::npos) << st.ToString();
  // The other shard still serves.
  EXPECT_TRUE(c.Push({PushItem::Of<float>((*t)[0], v)}).ok());
}

// More pushes in flight than the staging slot holds: they queue for space and
// every one is applied exactly once.
TEST_P(ClusterTest, ConcurrentPushesQueueForStagingSpace) {
  StartCluster(1, 1);  // 16 MiB slots
  Client& c = Connect(0);
  const size_t n = (3u << 20) / 4;  // 3 MiB: at most 5 fit at once
  auto w = c.Declare({"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> ones(n, 1.0f);
  std::vector<Future> futures;
  for (int i = 0; i < 16; ++i) futures.push_back(c.PushAsync({PushItem::Of<float>(*w, ones)}));
  for (auto& f : futures) ASSERT_TRUE(f.Wait().ok());
  std::vector<float> got(n);
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, got, 17)}).ok());
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return x == 16.0f; }));
}

}  // namespace
}  // namespace tessera
