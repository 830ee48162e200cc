// Updates applied exactly: SGD and Adam on the shard against a reference,
// chunk parts, sync steps.
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

// Through the whole path (staging slot, push-done, kernel, pull), SGD in f64
// matches the reference computed here bit for bit, including a learning-rate
// change by the chief halfway.
TEST_P(ClusterTest, SgdOnTheShardMatchesReferenceExactly) {
  StartCluster(2, 2);
  Client& chief = Connect(0);
  Client& other = Connect(1);
  const size_t n = 300000;  // 2.4 MB: chunked over both shards
  TensorSpec spec{"w", DType::kF64, {static_cast<int64_t>(n)}, UpdateRule::kSgd, {}, -1};
  spec.hyper.learning_rate = 0.1f;
  spec.hyper.weight_decay = 0.01f;
  std::vector<double> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i] = std::sin(static_cast<double>(i));
  spec.initial.resize(n * 8);
  std::memcpy(spec.initial.data(), ref.data(), n * 8);
  auto w = chief.Declare(spec);
  auto w2 = other.Declare(spec);
  ASSERT_TRUE(w.ok() && w2.ok());
  ASSERT_TRUE(chief.Initialize().ok());
  ASSERT_TRUE(other.WaitForInit(5s).ok());
  EXPECT_EQ(other.SetHyperparams(*w2, spec.hyper).code(), StatusCode::kFailedPrecondition);

  std::vector<double> g(n);
  double lr = 0.1, wd = static_cast<double>(0.01f);
  for (int step = 1; step <= 6; ++step) {
    if (step == 4) {
      Hyperparams h = spec.hyper;
      h.learning_rate = 0.05f;
      ASSERT_TRUE(chief.SetHyperparams(*w, h).ok());
      lr = static_cast<double>(0.05f);
    } else if (step == 1) {
      lr = static_cast<double>(0.1f);
    }
    for (size_t i = 0; i < n; ++i) g[i] = std::cos(static_cast<double>(i * step));
    Client& c = step % 2 ? chief : other;
    ASSERT_TRUE(c.Push({PushItem::Of<double>(step % 2 ? *w : *w2, g)}).ok());
    for (size_t i = 0; i < n; ++i) ref[i] -= lr * (g[i] + wd * ref[i]);
  }
  std::vector<double> got(n);
  ASSERT_TRUE(chief.Pull({PullItem::Of<double>(*w, got, 7)}).ok());
  EXPECT_TRUE(got == ref) << "first element " << got[0] << " vs " << ref[0];
}

// ChunkPart: two workers each push and pull their own chunks of a tensor
// (what NodeGroup's ranks do); the others are left alone.
TEST_P(ClusterTest, ChunkPartsMoveOnlyTheirChunks) {
  StartCluster(2, 2);
  Client& a = Connect(0);
  Client& b = Connect(1);
  const size_t n = 1u << 20;  // 4 MiB: 4 chunks of 1 MiB
  TensorSpec spec{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  spec.initial.assign(n * 4, 0);
  auto ta = a.Declare(spec).value();
  auto tb = b.Declare(spec).value();
  ASSERT_TRUE(a.Initialize().ok());
  ASSERT_TRUE(b.WaitForInit(5s).ok());
  const TensorInfo info = a.info(ta).value();
  ASSERT_EQ(info.chunks.size(), 4u);
  std::vector<float> ones(n, 1.0f), twos(n, 2.0f);
  PushItem pa{ta, ones.data(), n * 4, DType::kF32, BufferMemory::kHost, ChunkPart{0, 2}};
  PushItem pb{tb, twos.data(), n * 4, DType::kF32, BufferMemory::kHost, ChunkPart{1, 2}};
  const uint64_t put_before = a.counters().put_bytes;  // the initial value's
  ASSERT_TRUE(a.Push({pa}).ok());
  ASSERT_TRUE(b.Push({pb}).ok());
  EXPECT_EQ(a.counters().put_bytes - put_before, n * 2) << "worker 0 put more than chunks 0 and 2";

  std::vector<float> part(n, -1.0f), all(n);
  PullItem odd{ta, part.data(), n * 4, 2, DType::kF32, 0, BufferMemory::kHost, ChunkPart{1, 2}};
  ASSERT_TRUE(a.Pull({odd}).ok());
  ASSERT_TRUE(b.Pull({PullItem::Of<float>(tb, all, 2)}).ok());
  for (size_t c = 0; c < 4; ++c) {
    const size_t first = info.chunks[c].elem_offset, last = first + info.chunks[c].elem_count - 1;
    EXPECT_EQ(all[first], c % 2 ? 2.0f : 1.0f) << "chunk " << c;
    EXPECT_EQ(all[last], c % 2 ? 2.0f : 1.0f) << "chunk " << c;
    EXPECT_EQ(part[first], c % 2 ? 2.0f : -1.0f) << "chunk " << c;
    EXPECT_EQ(part[last], c % 2 ? 2.0f : -1.0f) << "chunk " << c;
  }
  PushItem bad{ta, ones.data(), n * 4, DType::kF32, BufferMemory::kHost, ChunkPart{2, 2}};
  Status st = a.Push({bad});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("chunk part 2 of 2"), std::string::npos) << st.ToString();

  // push_pull takes a part the same way: chunks 0 and 2 only, both ways.
  std::vector<float> back(n, -1.0f);
  const uint64_t put_mid = a.counters().put_bytes;
  PushPullItem pp{ta,          ones.data(),         back.data(),    n * 4,
                  DType::kF32, BufferMemory::kHost, ChunkPart{0, 2}};
  ASSERT_TRUE(a.PushPull({pp}).ok());
  EXPECT_EQ(a.counters().put_bytes - put_mid, n * 2) << "push_pull put more than its part";
  for (size_t c = 0; c < 4; ++c) {
    const size_t first = info.chunks[c].elem_offset, last = first + info.chunks[c].elem_count - 1;
    EXPECT_EQ(back[first], c % 2 ? -1.0f : 2.0f) << "chunk " << c;
    EXPECT_EQ(back[last], c % 2 ? -1.0f : 2.0f) << "chunk " << c;
  }
  pp.chunks = ChunkPart{1, 0};
  st = a.PushPull({pp});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST_P(ClusterTest, AdamOnBf16KeepsAnF32Master) {
  StartCluster(1, 1);
  Client& c = Connect(0);
  TensorSpec spec{"b", DType::kBF16, {1000}, UpdateRule::kAdam, {}, -1};
  spec.hyper.learning_rate = 1e-3f;
  std::vector<uint16_t> ones(1000, FloatToBFloat16(1.0f));
  spec.initial.resize(2000);
  std::memcpy(spec.initial.data(), ones.data(), 2000);
  auto b = c.Declare(spec);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(c.Initialize().ok());
  // Each Adam step moves a weight by ~lr = 1e-3, below bf16's resolution at
  // 1.0 (2^-7): stored in bf16 alone the weights would never move. The f32
  // master accumulates the 5 steps: 0.995, which rounds to 0.99609375.
  std::vector<uint16_t> grad(1000, FloatToBFloat16(1.0f)), got(1000);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.Push({{*b, grad.data(), 2000, DType::kBF16}}).ok());
  ASSERT_TRUE(c.Pull({{*b, got.data(), 2000, 6, DType::kBF16}}).ok());
  EXPECT_EQ(BFloat16ToFloat(got[0]), 0.99609375f);
  auto bad = c.Declare({"counts", DType::kI32, {4}, UpdateRule::kAdam, {}, -1});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("floating"), std::string::npos) << bad.status().ToString();
}

// SyncReplicasOptimizer semantics: N synchronous steps of 3 workers give
// exactly the reference computed from the same gradients (averaged, SGD, f64),
// whatever order the pushes arrive in.
TEST_P(ClusterTest, SyncStepsMatchReferenceExactly) {
  StartCluster(2, 3);
  const size_t n = 200000;  // chunked over both shards
  TensorSpec spec{"w", DType::kF64, {static_cast<int64_t>(n)}, UpdateRule::kSgd, {}, -1};
  spec.hyper.learning_rate = 0.25f;
  spec.mode = ConsistencyMode::Sync(3, 3, /*average=*/true);
  std::vector<double> ref(n, 1.0);
  spec.initial.resize(n * 8);
  std::memcpy(spec.initial.data(), ref.data(), n * 8);
  std::vector<Client*> workers;
  std::vector<Tensor> handles;
  for (int w = 0; w < 3; ++w) {
    workers.push_back(&Connect(w));
    auto t = workers.back()->Declare(spec);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    handles.push_back(*t);
  }
  ASSERT_TRUE(workers[0]->Initialize().ok());
  // Integer-valued gradients: their sum is exact in any order.
  auto gradient = [](int w, int t, size_t i) {
    return static_cast<double>((i + 7 * w + 3 * t) % 11) - 5;
  };
  const int steps = 5;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      if (w > 0 && !workers[w]->WaitForInit(10s).ok()) failures++;
      std::vector<double> g(n), got(n);
      for (int t = 0; t < steps; ++t) {
        for (size_t i = 0; i < n; ++i) g[i] = gradient(w, t, i);
        if (!workers[w]->Push({PushItem::Of<double>(handles[w], g)}, {.step = t}).ok()) failures++;
        // Step t+1's weights: everyone's step t applied.
        if (!workers[w]->Pull({PullItem::AfterStep<double>(handles[w], got, t + 1)}).ok())
          failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures, 0);
  const double lr = static_cast<double>(0.25f);
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int w = 0; w < 3; ++w) sum += gradient(w, t, i);
      ref[i] -= lr * (sum * (1.0 / 3));
    }
  }
  std::vector<double> got(n);
  ASSERT_TRUE(workers[0]->Pull({PullItem::AfterStep<double>(handles[0], got, steps)}).ok());
  EXPECT_TRUE(got == ref) << "element 0: " << got[0] << " vs " << ref[0];
  uint64_t applied = 0;
  for (auto& srv : servers_) applied += srv->stats().sync_steps_applied;
  EXPECT_EQ(applied, steps * 2u) << "one step per chunk per shard";
  EXPECT_EQ(EventualGlobalStep(*workers[2], steps), static_cast<uint64_t>(steps));
}

}  // namespace
}  // namespace tessera
