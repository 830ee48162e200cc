// NodeGroup (NCCL, BytePS's intra-node scheme) against the plain client:
// with one rank on any GPU machine, with one rank per GPU where there are
// several. Without a GPU, creating a group says why.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gpu/cuda.h"
#include "tessera/client.h"
#include "tessera/node_group.h"
#include "tessera/server.h"
#include "test_util.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

const char kSecret[] = "node-group-test-secret-0123456789";

struct Cluster {
  ClusterSpec spec;
  std::unique_ptr<Server> server;
};

Cluster StartCluster(int workers) {
  Cluster c;
  std::vector<TaskAddress> w;
  const auto ports = testing::UnusedPorts(static_cast<size_t>(workers) + 1);
  for (int i = 0; i < workers; ++i) w.push_back({"127.0.0.1", ports[i + 1]});
  EXPECT_TRUE(c.spec.AddJob("ps", {{"127.0.0.1", ports[0]}}).ok());
  EXPECT_TRUE(c.spec.AddJob("worker", w).ok());
  ServerOptions o;
  o.cluster = c.spec;
  o.secret = kSecret;
  auto s = Server::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) c.server = std::move(*s);
  return c;
}

std::unique_ptr<Client> Connect(const ClusterSpec& spec, int worker) {
  ClientOptions o;
  o.cluster = spec;
  o.task = {"worker", worker};
  o.secret = kSecret;
  o.startup_timeout = 10s;
  o.op_timeout = 30s;
  o.chunk_bytes = 64 << 10;     // several chunks, so that every rank owns some
  o.allow_host_staging = true;  // the in-process shard's fabric is Debian's UCX
  o.cuda_ipc = false;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(NodeGroup, SaysWhyItCannotStart) {
  Status gpu_st = gpu::Available();
  if (gpu_st.ok()) GTEST_SKIP() << "a GPU is here: the group starts (see the other cases)";
  Cluster cluster = StartCluster(1);
  auto client = Connect(cluster.spec, 0);
  ASSERT_NE(client, nullptr);
  NodeGroupOptions o;
  auto id = NewNodeGroupId();
  if (id.ok()) o.id = *id;
  auto group = NodeGroup::Create(*client, o);
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find(gpu_st.message()), std::string::npos)
      << group.status().ToString();
}

// `ranks` workers of one node, one per GPU, each with its own client: three
// async steps of Add through the group equal the sum of every rank's
// gradients; every rank ends with the whole tensor.
void RunGroup(int ranks) {
  Cluster cluster = StartCluster(ranks);
  auto id = NewNodeGroupId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  const size_t n = 100000;  // 400 KB: 7 chunks of 64 KiB
  TensorSpec spec{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  spec.initial.assign(n * 4, 0);
  auto gradient = [](int rank, size_t i) { return static_cast<float>((i + 3 * rank) % 17); };
  const int steps = 3;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const Status& st) {
        if (st.ok()) return false;
        ADD_FAILURE() << "rank " << r << ": " << st.ToString();
        failures++;
        return true;
      };
      auto client = Connect(cluster.spec, r);
      if (client == nullptr) return void(failures++);
      auto t = client->Declare(spec);
      if (fail(t.status())) return;
      if (r == 0 && fail(client->Initialize())) return;
      if (r != 0 && fail(client->WaitForInit(20s))) return;
      NodeGroupOptions o;
      o.local_rank = r;
      o.local_size = ranks;
      o.id = *id;
      o.cuda_device = r;
      auto group = NodeGroup::Create(*client, o);
      if (fail(group.status())) return;
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = gradient(r, i);
      auto stream = gpu::Stream::Create(r).value();
      auto dg = gpu::DeviceBuffer::Allocate(n * 4, r).value();
      auto dw = gpu::DeviceBuffer::Allocate(n * 4, r).value();
      if (fail(gpu::Copy(dg.data(), g.data(), n * 4, stream)) || fail(stream.Synchronize())) return;
      for (int s = 0; s < steps; ++s) {
        if (fail((*group)->Push(*t, dg.data(), static_cast<uint64_t>(s)))) return;
      }
      // Version 1 + steps: every chunk got one push per step from its owner.
      if (fail((*group)->Pull(*t, dw.data(), 1 + steps))) return;
      results[static_cast<size_t>(r)].resize(n);
      if (fail(gpu::Copy(results[static_cast<size_t>(r)].data(), dw.data(), n * 4, stream)) ||
          fail(stream.Synchronize())) {
        return;
      }
      // Each rank moved its own chunks over the fabric, and no others.
      uint64_t owned = 0;
      const TensorInfo info = client->info(*t).value();
      for (size_t i = 0; i < info.chunks.size(); ++i) {
        if (i % static_cast<size_t>(ranks) == static_cast<size_t>(r)) {
          owned += info.chunks[i].elem_count * 4;
        }
      }
      EXPECT_EQ(client->counters().put_bytes, steps * owned) << "rank " << r;
      EXPECT_EQ(client->counters().get_bytes, owned) << "rank " << r;
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures, 0);
  for (int r = 0; r < ranks; ++r) {
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q = 0; q < ranks; ++q) want += gradient(q, i);
      wrong += results[static_cast<size_t>(r)][i] != steps * want;
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r << " holds other values";
  }
}

TEST(NodeGroup, OneRankIsThePlainClient) {
  if (Status st = gpu::Available(); !st.ok()) GTEST_SKIP() << "needs a GPU: " << st.message();
  RunGroup(1);
}

TEST(NodeGroup, OneRankPerGpuOfThisMachine) {
  if (Status st = gpu::Available(); !st.ok()) GTEST_SKIP() << "needs a GPU: " << st.message();
  const int gpus = gpu::DeviceCount().value_or(0);
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs or more; this machine has " << gpus;
  RunGroup(gpus);
}

}  // namespace
}  // namespace tessera
