// A shard whose parameters live on a GPU (ServerOptions::memory "cuda")
// against one in host memory: the same initial values, pushes and pulls must
// give the same bytes for every update rule and dtype, inline and one-sided,
// for sync steps and across a checkpoint. Where no GPU can be used (CI), the
// GPU cases skip with CUDA's own reason, and what a shard says when asked for
// GPU memory it cannot have is tested instead.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gpu/cuda.h"
#include "gpu/stream_order.h"
#include "kernels/update.h"
#include "tessera/client.h"
#include "tessera/server.h"
#include "test_util.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const char kSecret[] = "gpu-shard-test-secret-0123456789";

// One ps task and `workers` workers on loopback, its parameters in `memory`.
class OneShard {
 public:
  OneShard(const std::string& memory, int workers, const std::string& checkpoint_dir = "") {
    std::vector<TaskAddress> w;
    const auto ports = testing::UnusedPorts(static_cast<size_t>(workers) + 1);
    for (int i = 0; i < workers; ++i) w.push_back({"127.0.0.1", ports[i + 1]});
    status_ = spec_.AddJob("ps", {{"127.0.0.1", ports[0]}});
    if (status_.ok()) status_ = spec_.AddJob("worker", w);
    if (!status_.ok()) return;
    ServerOptions o;
    o.cluster = spec_;
    o.secret = kSecret;
    o.memory = memory;
    // Debian's UCX cannot reach GPU memory: stage where it must (counted).
    o.allow_host_staging = true;
    o.staging_bytes_per_worker = 8u << 20;
    o.checkpoint_dir = checkpoint_dir;
    auto s = Server::Start(o);
    status_ = s.status();
    if (s.ok()) server_ = std::move(*s);
  }
  ~OneShard() {
    clients_.clear();
    if (server_) server_->Stop();
  }
  const Status& status() const { return status_; }
  Server& server() { return *server_; }

  Client& Connect(int worker, bool allow_host_staging = false) {
    ClientOptions o;
    o.cluster = spec_;
    o.task = {"worker", worker};
    o.secret = kSecret;
    o.startup_timeout = 10s;
    o.op_timeout = 30s;
    o.allow_host_staging = allow_host_staging;
    // In one process CUDA IPC cannot map the shard's memory: the fabric.
    o.cuda_ipc = false;
    clients_.push_back(
        testing::ValueOrThrow(Client::Connect(o), "connecting worker " + std::to_string(worker)));
    return *clients_.back();
  }

 private:
  ClusterSpec spec_;
  Status status_;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<Client>> clients_;
};

// The memory compared with host memory: "cuda", or what
// TESSERA_TEST_COMPARED_MEMORY names ("host" checks these tests themselves
// on a machine without a GPU).
std::string ComparedMemory() {
  const char* m = std::getenv("TESSERA_TEST_COMPARED_MEMORY");
  return m != nullptr ? m : "cuda";
}

// Skips a GPU case where this process cannot use a GPU, saying why.
#define SKIP_WITHOUT_GPU()                                 \
  do {                                                     \
    Status gpu_st = gpu::Available();                      \
    if (ComparedMemory() != "host" && !gpu_st.ok()) {      \
      GTEST_SKIP() << "needs a GPU: " << gpu_st.message(); \
    }                                                      \
  } while (0)

TEST(GpuShardStart, SaysWhyItCannotHoldParametersOnAGpu) {
  {
    OneShard bad("gpu", 1);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find("expected host, cuda or cuda:N"), std::string::npos);
  }
  const Status gpu_st = gpu::Available();
  OneShard shard("cuda", 1);
  if (!gpu_st.ok()) {
    // No GPU here: the shard refuses at start with CUDA's reason.
    ASSERT_FALSE(shard.status().ok());
    EXPECT_NE(shard.status().message().find(gpu_st.message()), std::string::npos)
        << shard.status().ToString();
    EXPECT_NE(shard.status().message().find("cuda:0"), std::string::npos);
    return;
  }
  ASSERT_TRUE(shard.status().ok()) << shard.status().ToString();
  auto count = gpu::DeviceCount();
  ASSERT_TRUE(count.ok());
  OneShard missing("cuda:" + std::to_string(*count), 1);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos);
}

// Without --allow-host-staging a fabric that cannot reach GPU memory is an
// error naming what is missing; with it, every staged byte is counted.
TEST(GpuShardStart, HostStagingOnlyWhenAllowed) {
  if (Status gpu_st = gpu::Available(); !gpu_st.ok()) {
    GTEST_SKIP() << "needs a GPU: " << gpu_st.message();
  }
  ClusterSpec spec;
  const auto ports = testing::UnusedPorts(2);
  ASSERT_TRUE(spec.AddJob("ps", {{"127.0.0.1", ports[0]}}).ok());
  ASSERT_TRUE(spec.AddJob("worker", {{"127.0.0.1", ports[1]}}).ok());
  ServerOptions o;
  o.cluster = spec;
  o.secret = kSecret;
  o.memory = "cuda";
  auto strict = Server::Start(o);
  if (strict.ok()) {
    (*strict)->Stop();
    GTEST_SKIP() << "this fabric reaches GPU memory: nothing is staged";
  }
  EXPECT_EQ(strict.status().code(), StatusCode::kFailedPrecondition) << strict.status().ToString();
  EXPECT_NE(strict.status().message().find("--allow-host-staging"), std::string::npos);

  OneShard shard("cuda", 1);
  ASSERT_TRUE(shard.status().ok()) << shard.status().ToString();
  Client& c = shard.Connect(0);
  const size_t n = 100000;  // one-sided, through the staging slot
  TensorSpec t{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  t.initial.assign(n * 4, 0);
  auto w = c.Declare(t);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.Initialize().ok());
  const uint64_t before = shard.server().stats().host_staged_bytes;
  std::vector<float> g(n, 1.5f), got(n);
  ASSERT_TRUE(c.Push({PushItem::Of<float>(*w, g)}).ok());
  ASSERT_TRUE(c.Pull({PullItem::Of<float>(*w, got, 2)}).ok());
  EXPECT_EQ(got, g);
  // The gradient in, the new value out.
  EXPECT_EQ(shard.server().stats().host_staged_bytes - before, 2 * n * 4);
}

struct RuleCase {
  UpdateRule rule;
  DType dtype;
};

std::string CaseName(const ::testing::TestParamInfo<RuleCase>& info) {
  return std::string(UpdateRuleName(info.param.rule)) + "_" + DTypeName(info.param.dtype);
}

// Deterministic values of `dtype` (floats in about [-1, 1]).
std::vector<uint8_t> Values(DType dtype, size_t n, int seed) {
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  for (size_t i = 0; i < n; ++i) {
    const double v = std::sin(static_cast<double>(i * 7 + seed * 13) * 0.01);
    const bool floating = dtype != DType::kI32 && dtype != DType::kI64;
    StoreAs(dtype, floating ? v : std::round(v * 100), out.data() + i * DTypeSize(dtype));
  }
  return out;
}

class GpuShardRules : public ::testing::TestWithParam<RuleCase> {};

// Three pushes to a large (one-sided) and a small (inline) tensor, on a
// host shard and a GPU shard: the pulled bytes are the same.
TEST_P(GpuShardRules, MatchTheHostShardBitForBit) {
  SKIP_WITHOUT_GPU();
  // Named copies, not a structured binding: clang before 16 cannot capture
  // a binding in a lambda.
  const UpdateRule rule = GetParam().rule;
  const DType dtype = GetParam().dtype;
  auto run = [&](const std::string& memory) {
    OneShard shard(memory, 1);
    EXPECT_TRUE(shard.status().ok()) << shard.status().ToString();
    if (!shard.status().ok()) return std::vector<uint8_t>{};
    Client& c = shard.Connect(0);
    std::vector<uint8_t> out;
    std::vector<Tensor> ts;
    for (size_t n : {size_t{70000}, size_t{24}}) {
      TensorSpec t{"t" + std::to_string(n), dtype, {static_cast<int64_t>(n)}, rule, {}, -1};
      t.hyper.learning_rate = 0.01f;
      t.hyper.weight_decay = 0.001f;
      t.hyper.epsilon = 1e-6f;
      t.hyper.initial_accumulator = 0.1f;
      t.initial = Values(dtype, n, 1);
      auto h = c.Declare(t);
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (!h.ok()) return out;
      ts.push_back(*h);
    }
    EXPECT_TRUE(c.Initialize().ok());
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < ts.size(); ++i) {
        const size_t n = i == 0 ? 70000 : 24;
        auto g = Values(dtype, n, 2 + step);
        EXPECT_TRUE(c.Push({{ts[i], g.data(), g.size(), dtype}}).ok());
      }
    }
    for (size_t i = 0; i < ts.size(); ++i) {
      std::vector<uint8_t> got((i == 0 ? 70000 : 24) * DTypeSize(dtype));
      EXPECT_TRUE(c.Pull({{ts[i], got.data(), got.size(), 4, dtype}}).ok());
      out.insert(out.end(), got.begin(), got.end());
    }
    return out;
  };
  const auto host = run("host");
  const auto gpu = run(ComparedMemory());
  ASSERT_EQ(host.size(), gpu.size());
  size_t first_diff = host.size();
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != gpu[i]) {
      first_diff = i;
      break;
    }
  }
  EXPECT_EQ(first_diff, host.size())
      << "GPU shard differs from the host shard at byte " << first_diff;
}

std::vector<RuleCase> AllCases() {
  std::vector<RuleCase> out;
  for (UpdateRule r :
       {UpdateRule::kAssign, UpdateRule::kAdd, UpdateRule::kSgd, UpdateRule::kMomentum,
        UpdateRule::kAdam, UpdateRule::kAdamW, UpdateRule::kAdagrad}) {
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) out.push_back({r, d});
  }
  out.push_back({UpdateRule::kAdd, DType::kI32});
  out.push_back({UpdateRule::kAssign, DType::kI64});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, GpuShardRules, ::testing::ValuesIn(AllCases()), CaseName);

// Sync steps (averaged f16 gradients summed in f32 on the GPU) and a
// checkpoint of GPU-resident parameters, restored by a new GPU shard.
TEST(GpuShard, SyncStepsAndACheckpointRoundTrip) {
  SKIP_WITHOUT_GPU();
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-gpu-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const size_t n = 50000;
  TensorSpec t{"w", DType::kF16, {static_cast<int64_t>(n)}, UpdateRule::kAdam, {}, -1};
  t.initial = Values(DType::kF16, n, 3);
  t.mode = ConsistencyMode::Sync(2, 2, /*average=*/true);
  auto train = [&](const std::string& memory, const std::string& ckpt) {
    OneShard shard(memory, 2, ckpt);
    EXPECT_TRUE(shard.status().ok()) << shard.status().ToString();
    Client& a = shard.Connect(0);
    Client& b = shard.Connect(1);
    auto ta = a.Declare(t).value();
    auto tb = b.Declare(t).value();
    EXPECT_TRUE(a.Initialize().ok());
    EXPECT_TRUE(b.WaitForInit(10s).ok());
    for (uint64_t step = 0; step < 3; ++step) {
      auto ga = Values(DType::kF16, n, 10 + static_cast<int>(step));
      auto gb = Values(DType::kF16, n, 20 + static_cast<int>(step));
      EXPECT_TRUE(a.Push({{ta, ga.data(), ga.size(), DType::kF16}}, {.step = step}).ok());
      EXPECT_TRUE(b.Push({{tb, gb.data(), gb.size(), DType::kF16}}, {.step = step}).ok());
    }
    std::vector<uint8_t> got(n * 2);
    PullItem item{ta, got.data(), got.size(), 1, DType::kF16, 3};
    EXPECT_TRUE(a.Pull({item}).ok());
    if (!ckpt.empty()) {
      EXPECT_TRUE(a.SaveCheckpoint().ok());
    }
    return got;
  };
  const auto host = train("host", "");
  const auto gpu = train(ComparedMemory(), dir.string());
  EXPECT_TRUE(host == gpu) << "sync steps on the GPU differ from the host's";

  OneShard restored(ComparedMemory(), 2, dir.string());
  ASSERT_TRUE(restored.status().ok()) << restored.status().ToString();
  Client& c = restored.Connect(0);
  auto w = c.Declare(t).value();
  EXPECT_EQ(c.restored_step(), std::optional<uint64_t>(3));
  std::vector<uint8_t> got(n * 2);
  ASSERT_TRUE(c.Pull({{w, got.data(), got.size(), 1, DType::kF16}}).ok());
  EXPECT_TRUE(got == gpu) << "the restored GPU shard holds other values";
  fs::remove_all(dir);
}

ClientOptions WorkerOptions(const ClusterSpec& spec, int worker) {
  ClientOptions o;
  o.cluster = spec;
  o.task = {"worker", worker};
  o.secret = kSecret;
  o.startup_timeout = 20s;
  o.op_timeout = 30s;
  return o;
}

// Runs everywhere: a buffer said to be GPU memory that CUDA does not know
// as such is refused, naming both.
TEST(GpuBuffers, AWrongMemoryKindIsNamed) {
  OneShard shard("host", 1);
  ASSERT_TRUE(shard.status().ok()) << shard.status().ToString();
  Client& c = shard.Connect(0);
  TensorSpec t{"w", DType::kF32, {4}, UpdateRule::kAssign, {}, -1};
  auto w = c.Declare(t).value();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> host(4, 1.0f);
  PushItem item{w, host.data(), 16, DType::kF32, BufferMemory::kCuda};
  Status st = c.Push({item});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("given as GPU memory"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("push"), std::string::npos) << st.ToString();
}

// A GPU buffer and a fabric that cannot reach GPU memory (Debian's UCX):
// refused, naming the way out, unless staging through host memory is
// allowed; then exact, and every staged byte counted.
TEST(GpuBuffers, StagedThroughHostOnlyWhenAllowed) {
  if (Status gpu_st = gpu::Available(); !gpu_st.ok()) {
    GTEST_SKIP() << "needs a GPU: " << gpu_st.message();
  }
  OneShard shard("host", 2);
  ASSERT_TRUE(shard.status().ok()) << shard.status().ToString();
  const size_t n = 100000;  // one-sided
  TensorSpec t{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  t.initial.assign(n * 4, 0);
  std::vector<float> ones(n, 1.0f), got(n);
  auto dev = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  auto stream = gpu::Stream::Create(0).value();
  ASSERT_TRUE(gpu::Copy(dev.data(), ones.data(), n * 4, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());

  Client& strict = shard.Connect(0);
  auto w = strict.Declare(t).value();
  ASSERT_TRUE(strict.Initialize().ok());
  Status refused = strict.Push({{w, dev.data(), n * 4, DType::kF32}});
  if (refused.ok()) GTEST_SKIP() << "this fabric reaches GPU memory: nothing to stage";
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("allow_host_staging"), std::string::npos) << refused.ToString();

  Client& staged = shard.Connect(1, /*allow_host_staging=*/true);
  auto w1 = staged.Declare(t).value();
  ASSERT_TRUE(staged.WaitForInit(10s).ok());
  ASSERT_TRUE(staged.Push({{w1, dev.data(), n * 4, DType::kF32}}).ok());
  auto back = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  ASSERT_TRUE(staged.Pull({{w1, back.data(), n * 4, 2, DType::kF32}}).ok());
  ASSERT_TRUE(gpu::Copy(got.data(), back.data(), n * 4, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  EXPECT_EQ(got, ones);
  EXPECT_EQ(staged.counters().host_staged_bytes, 2 * n * 4);  // up and back down
}

// The same-node path: a GPU shard process and two workers here with GPU
// buffers, through CUDA IPC: exact values, no host staging, no puts.
TEST(GpuBuffers, CudaIpcToAShardProcessOnThisNode) {
  if (Status gpu_st = gpu::Available(); !gpu_st.ok()) {
    GTEST_SKIP() << "needs a GPU: " << gpu_st.message();
  }
  ASSERT_NE(std::getenv("TESSERA_BIN"), nullptr) << "run by meson, which sets TESSERA_BIN";
  ClusterSpec spec;
  const auto ports = testing::UnusedPorts(3);
  ASSERT_TRUE(spec.AddJob("ps", {{"127.0.0.1", ports[0]}}).ok());
  ASSERT_TRUE(spec.AddJob("worker", {{"127.0.0.1", ports[1]}, {"127.0.0.1", ports[2]}}).ok());
  testing::ShardProcesses shard(spec, kSecret, 1,
                                {"--memory", "cuda", "--allow-host-staging", "--staging-mib", "8"});
  ASSERT_TRUE(shard.started());
  auto a = Client::Connect(WorkerOptions(spec, 0));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Client::Connect(WorkerOptions(spec, 1));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*a)->counters().cuda_ipc_shards, 1) << "the shard did not offer CUDA IPC";

  const size_t n = 1 << 20;  // 4 MiB: one-sided; and a small inline tensor
  TensorSpec big{"big", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  big.initial.assign(n * 4, 0);
  TensorSpec small{"small", DType::kF32, {8}, UpdateRule::kAdd, {}, -1};
  small.initial.assign(32, 0);
  auto ta = (*a)->DeclareMany({big, small}).value();
  auto tb = (*b)->DeclareMany({big, small}).value();
  ASSERT_TRUE((*a)->Initialize().ok());
  ASSERT_TRUE((*b)->WaitForInit(10s).ok());

  // Integer-valued gradients: sums are exact in any order.
  std::vector<float> ga(n), gb(n);
  for (size_t i = 0; i < n; ++i) {
    ga[i] = static_cast<float>(i % 1000);
    gb[i] = static_cast<float>(7 - static_cast<int>(i % 13));
  }
  auto stream = gpu::Stream::Create(0).value();
  auto da = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  auto db = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  ASSERT_TRUE(gpu::Copy(da.data(), ga.data(), n * 4, stream).ok());
  ASSERT_TRUE(gpu::Copy(db.data(), gb.data(), n * 4, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  const int rounds = 3;
  for (int r = 0; r < rounds; ++r) {
    ASSERT_TRUE(
        (*a)->Push({{ta[0], da.data(), n * 4, DType::kF32}, {ta[1], da.data(), 32, DType::kF32}})
            .ok());
    ASSERT_TRUE(
        (*b)->Push({{tb[0], db.data(), n * 4, DType::kF32}, {tb[1], db.data(), 32, DType::kF32}})
            .ok());
  }
  auto out = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  ASSERT_TRUE((*b)->Pull({{tb[0], out.data(), n * 4, 1 + 2 * rounds, DType::kF32}}).ok());
  std::vector<float> got(n);
  ASSERT_TRUE(gpu::Copy(got.data(), out.data(), n * 4, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += got[i] != rounds * (ga[i] + gb[i]);
  EXPECT_EQ(wrong, 0u) << "elements differ from the sum of the pushes";
  std::vector<float> small_got(8);
  ASSERT_TRUE((*a)->Pull({{ta[1], small_got.data(), 32, 1 + 2 * rounds, DType::kF32}}).ok());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(small_got[i], rounds * (ga[i] + gb[i]));

  const ClientCounters ca = (*a)->counters();
  EXPECT_EQ(ca.host_staged_bytes, 0u);
  EXPECT_EQ(ca.put_bytes, 0u) << "bytes went over the fabric instead of CUDA IPC";
  EXPECT_GE(ca.cuda_ipc_bytes, rounds * n * 4);
  EXPECT_GE((*b)->counters().cuda_ipc_bytes, (rounds + 1) * n * 4);
}

// Calls ordered on the caller's CUDA stream: the push reads the gradient
// only once the stream's work before it is done, and the stream's work
// after the pull sees the pulled weights; nothing synchronises the host in
// between. A host function holding the stream until the test lets it go
// shows that the push waits for the stream, and can be cancelled meanwhile.
TEST(GpuBuffers, StreamOrderedPushAndPull) {
  if (Status gpu_st = gpu::Available(); !gpu_st.ok()) {
    GTEST_SKIP() << "needs a GPU: " << gpu_st.message();
  }
  ASSERT_NE(std::getenv("TESSERA_BIN"), nullptr) << "run by meson, which sets TESSERA_BIN";
  ClusterSpec spec;
  const auto ports = testing::UnusedPorts(2);
  ASSERT_TRUE(spec.AddJob("ps", {{"127.0.0.1", ports[0]}}).ok());
  ASSERT_TRUE(spec.AddJob("worker", {{"127.0.0.1", ports[1]}}).ok());
  testing::ShardProcesses shard(spec, kSecret, 1,
                                {"--memory", "cuda", "--allow-host-staging", "--staging-mib", "8"});
  ASSERT_TRUE(shard.started());
  auto c = Client::Connect(WorkerOptions(spec, 0));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const size_t n = 1 << 20;  // 4 MiB: one-sided
  TensorSpec t{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  t.initial.assign(n * 4, 0);
  auto w = (*c)->Declare(t).value();
  ASSERT_TRUE((*c)->Initialize().ok());

  std::vector<float> ones(n, 1.0f), got(n, -1.0f);
  auto stream = gpu::Stream::Create(0).value();
  auto source = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  auto grad = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  auto weights = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  auto seen = gpu::DeviceBuffer::Allocate(n * 4, 0).value();
  ASSERT_TRUE(gpu::Copy(source.data(), ones.data(), n * 4, stream).ok());
  ASSERT_TRUE(gpu::Zero(grad.data(), n * 4, stream).ok());
  ASSERT_TRUE(gpu::Zero(weights.data(), n * 4, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());

  // Held: nothing enqueued from here on runs until `go`. Only device to
  // device copies below, which never wait on the host.
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  ASSERT_TRUE(gpu::EnqueueHostCall(stream.handle(), [released] { released.wait(); }).ok());
  ASSERT_TRUE(gpu::Copy(grad.data(), source.data(), n * 4, stream).ok());  // the "backward"
  const CallOptions on{stream.handle()};
  Future push = (*c)->PushAsync({{w, grad.data(), n * 4, DType::kF32}}, {.call = on});
  Future cancelled = (*c)->PushAsync({{w, grad.data(), n * 4, DType::kF32}}, {.call = on});
  Future pull = (*c)->PullAsync({{w, weights.data(), n * 4, 2, DType::kF32}}, on);
  ASSERT_TRUE(gpu::Copy(seen.data(), weights.data(), n * 4, stream).ok());  // the "forward"
  EXPECT_TRUE(cancelled.Cancel()) << "the stream had not reached the second push";
  EXPECT_FALSE(push.ready()) << "the push ran before the stream's work before it";
  go.set_value();

  ASSERT_TRUE(push.Wait().ok()) << push.Wait();
  EXPECT_EQ(cancelled.Wait().code(), StatusCode::kCancelled);
  ASSERT_TRUE(pull.Wait().ok()) << pull.Wait();
  ASSERT_TRUE(stream.Synchronize().ok());
  ASSERT_TRUE(gpu::Copy(got.data(), seen.data(), n * 4, stream).ok());
  ASSERT_TRUE(stream.Synchronize().ok());
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += got[i] != 1.0f;
  EXPECT_EQ(wrong, 0u) << "the stream's work after the pull did not see one push's weights";
}

}  // namespace
}  // namespace tessera
