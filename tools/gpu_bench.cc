// tessera-gpu-bench: what tools/device-check.sh measures on a GPU machine,
// each figure beside its baseline from the same run.
//
//   kernels   each update rule's kernel against a device-to-device
//             cudaMemcpy of the bytes the kernel reads and writes
//   adam      Tessera's Adam kernel on tensors from files (for the
//             comparison with PyTorch's fused Adam, tools/device_check/)
//   ipc       push and pull of GPU buffers to a GPU shard process on this
//             node (CUDA IPC) against a cudaMemcpy of the same bytes
//
// Every mode prints a JSON object on stdout; medians of --iters runs.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/ports.h"
#include "core/secret.h"
#include "gpu/cuda.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/update.h"
#include "tessera/client.h"
#include "tessera/cluster.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds per call of fn (which enqueues work on `stream`), median of iters.
template <typename Fn>
Result<double> Time(const gpu::Stream& stream, int iters, Fn fn) {
  std::vector<double> t;
  for (int i = -2; i < iters; ++i) {  // two warm-ups
    const auto start = Clock::now();
    TESSERA_RETURN_IF_ERROR(fn());
    TESSERA_RETURN_IF_ERROR(stream.Synchronize());
    if (i >= 0) t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return Median(t);
}

Status Fill(const gpu::DeviceBuffer& b, const gpu::Stream& s, DType dtype, double scale) {
  const size_t n = b.size() / DTypeSize(dtype);
  std::vector<uint8_t> host(b.size());
  for (size_t i = 0; i < n; ++i) {
    StoreAs(dtype, scale * (static_cast<double>(i % 1021) / 1021.0 - 0.5),
            host.data() + i * DTypeSize(dtype));
  }
  TESSERA_RETURN_IF_ERROR(gpu::Copy(b.data(), host.data(), b.size(), s));
  return s.Synchronize();
}

Result<json> KernelsVsMemcpy(size_t n, int iters) {
  auto stream = gpu::Stream::Create(0);
  if (!stream.ok()) return stream.status();
  json rows = json::array();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (UpdateRule rule : {UpdateRule::kAdd, UpdateRule::kSgd, UpdateRule::kMomentum,
                            UpdateRule::kAdam, UpdateRule::kAdamW, UpdateRule::kAdagrad}) {
      const size_t es = DTypeSize(dtype), ss = kernels::StateElementSize(dtype);
      const int slots = kernels::StateSlots(rule);
      const bool master = kernels::NeedsMaster(dtype, rule);
      auto param = gpu::DeviceBuffer::Allocate(n * es, 0);
      auto grad = gpu::DeviceBuffer::Allocate(n * es, 0);
      auto s0 = gpu::DeviceBuffer::Allocate(std::max<size_t>(n * ss * (slots >= 1), 1), 0);
      auto s1 = gpu::DeviceBuffer::Allocate(std::max<size_t>(n * ss * (slots >= 2), 1), 0);
      auto m = gpu::DeviceBuffer::Allocate(master ? n * 4 : 1, 0);
      for (auto* b : {&param, &grad, &s0, &s1, &m}) {
        if (!b->ok()) return b->status();
      }
      TESSERA_RETURN_IF_ERROR(Fill(*param, *stream, dtype, 1.0));
      TESSERA_RETURN_IF_ERROR(Fill(*grad, *stream, dtype, 0.01));
      TESSERA_RETURN_IF_ERROR(gpu::Zero(s0->data(), s0->size(), *stream));
      TESSERA_RETURN_IF_ERROR(gpu::Zero(s1->data(), s1->size(), *stream));
      TESSERA_RETURN_IF_ERROR(gpu::Zero(m->data(), m->size(), *stream));
      Hyperparams h;
      h.learning_rate = 1e-4f;
      kernels::RuleState state{slots >= 1 ? s0->data() : nullptr, slots >= 2 ? s1->data() : nullptr,
                               master ? static_cast<float*>(m->data()) : nullptr};
      uint64_t step = 0;
      auto kernel = [&]() -> Status {
        if (IsOptimizer(rule)) {
          return kernels::cuda::ApplyOptimizer(rule, h, dtype, param->data(), grad->data(), n,
                                               state, ++step, stream->handle());
        }
        return kernels::cuda::ApplyUpdate(rule, dtype, param->data(), grad->data(), n,
                                          stream->handle());
      };
      auto t_kernel = Time(*stream, iters, kernel);
      if (!t_kernel.ok()) return t_kernel.status();
      // What the kernel must move: the parameter read and written, the
      // gradient read, each state slot and the master read and written.
      const size_t moved = n * (3 * es + 2 * ss * slots + (master ? 8 : 0));
      // A copy of moved/2 bytes reads and writes `moved` bytes.
      const size_t copy_bytes = moved / 2;
      auto src = gpu::DeviceBuffer::Allocate(copy_bytes, 0);
      auto dst = gpu::DeviceBuffer::Allocate(copy_bytes, 0);
      if (!src.ok() || !dst.ok()) return src.ok() ? dst.status() : src.status();
      auto t_copy = Time(*stream, iters,
                         [&] { return gpu::Copy(dst->data(), src->data(), copy_bytes, *stream); });
      if (!t_copy.ok()) return t_copy.status();
      const double kernel_gbs = static_cast<double>(moved) / *t_kernel / 1e9;
      const double copy_gbs = static_cast<double>(moved) / *t_copy / 1e9;
      rows.push_back({{"rule", UpdateRuleName(rule)},
                      {"dtype", DTypeName(dtype)},
                      {"elements", n},
                      {"bytes_moved", moved},
                      {"kernel_s", *t_kernel},
                      {"memcpy_s", *t_copy},
                      {"kernel_GBps", kernel_gbs},
                      {"memcpy_GBps", copy_gbs},
                      {"ratio", kernel_gbs / copy_gbs}});
      fprintf(stderr, "%-9s %-5s kernel %8.1f GB/s  memcpy %8.1f GB/s  ratio %.2f\n",
              UpdateRuleName(rule), DTypeName(dtype), kernel_gbs, copy_gbs, kernel_gbs / copy_gbs);
    }
  }
  return json{{"mode", "kernels"}, {"rows", rows}};
}

Result<std::vector<float>> ReadFloats(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> v(n);
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4))) {
    return Status::InvalidArgument(path + ": fewer than " + std::to_string(n) + " floats");
  }
  return v;
}

// `steps` Adam steps of the f32 parameter in dir/param.f32 with the
// gradients dir/grad.f32 (steps x n), the result to dir/tessera.f32.
Result<json> AdamFromFiles(const std::string& dir, size_t n, int steps, const Hyperparams& h,
                           int iters) {
  auto p0 = ReadFloats(dir + "/param.f32", n);
  if (!p0.ok()) return p0.status();
  auto grads = ReadFloats(dir + "/grad.f32", n * static_cast<size_t>(steps));
  if (!grads.ok()) return grads.status();
  auto stream = gpu::Stream::Create(0);
  if (!stream.ok()) return stream.status();
  auto p = gpu::DeviceBuffer::Allocate(n * 4, 0);
  auto g = gpu::DeviceBuffer::Allocate(n * 4 * static_cast<size_t>(steps), 0);
  auto m = gpu::DeviceBuffer::Allocate(n * 4, 0);
  auto v = gpu::DeviceBuffer::Allocate(n * 4, 0);
  for (auto* b : {&p, &g, &m, &v}) {
    if (!b->ok()) return b->status();
  }
  auto reset = [&]() -> Status {
    TESSERA_RETURN_IF_ERROR(gpu::Copy(p->data(), p0->data(), n * 4, *stream));
    TESSERA_RETURN_IF_ERROR(gpu::Zero(m->data(), n * 4, *stream));
    TESSERA_RETURN_IF_ERROR(gpu::Zero(v->data(), n * 4, *stream));
    return stream->Synchronize();
  };
  TESSERA_RETURN_IF_ERROR(reset());
  TESSERA_RETURN_IF_ERROR(gpu::Copy(g->data(), grads->data(), g->size(), *stream));
  kernels::RuleState state{m->data(), v->data(), nullptr};
  auto run = [&]() -> Status {
    for (int s = 0; s < steps; ++s) {
      TESSERA_RETURN_IF_ERROR(kernels::cuda::ApplyOptimizer(
          UpdateRule::kAdam, h, DType::kF32, p->data(),
          static_cast<const float*>(g->data()) + static_cast<size_t>(s) * n, n, state,
          static_cast<uint64_t>(s + 1), stream->handle()));
    }
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(run());
  TESSERA_RETURN_IF_ERROR(stream->Synchronize());
  std::vector<float> out(n);
  TESSERA_RETURN_IF_ERROR(gpu::Copy(out.data(), p->data(), n * 4, *stream));
  TESSERA_RETURN_IF_ERROR(stream->Synchronize());
  std::ofstream(dir + "/tessera.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(n * 4));
  // Timing: the whole sequence again from the same start, per step.
  auto t = Time(*stream, iters, [&]() -> Status {
    TESSERA_RETURN_IF_ERROR(reset());
    return run();
  });
  if (!t.ok()) return t.status();
  auto t_reset = Time(*stream, iters, reset);
  if (!t_reset.ok()) return t_reset.status();
  return json{
      {"mode", "adam"}, {"elements", n}, {"steps", steps}, {"step_s", (*t - *t_reset) / steps}};
}

// A `tessera server --memory cuda` child on this node, killed on scope exit.
class ShardChild {
 public:
  ShardChild(const std::string& bin, const ClusterSpec& spec, const std::string& secret) {
    const std::string tf_config = ToTfConfigJson(spec, {"ps", 0});
    pid_ = fork();
    if (pid_ == 0) {
      setenv("TESSERA_SECRET", secret.c_str(), 1);
      setenv("TF_CONFIG", tf_config.c_str(), 1);
      execl(bin.c_str(), bin.c_str(), "server", "--memory", "cuda", "--allow-host-staging",
            "--staging-mib", "600", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~ShardChild() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }

 private:
  pid_t pid_ = -1;
};

Result<json> IpcPushPull(const std::string& tessera_bin, size_t bytes, int iters) {
  ClusterSpec spec;
  TESSERA_RETURN_IF_ERROR(spec.AddJob("ps", {{"127.0.0.1", PickListenPort("127.0.0.1")}}));
  TESSERA_RETURN_IF_ERROR(spec.AddJob("worker", {{"127.0.0.1", PickListenPort("127.0.0.1")}}));
  TESSERA_ASSIGN_OR_RETURN(const std::string secret, GenerateSecret());
  ShardChild shard(tessera_bin, spec, secret);
  ClientOptions o;
  o.cluster = spec;
  o.secret = secret;
  o.startup_timeout = std::chrono::seconds(30);
  o.chunk_bytes = bytes;  // one chunk: one copy each way
  auto client = Client::Connect(o);
  if (!client.ok()) return client.status();
  const size_t n = bytes / 4;
  TensorSpec t{"w", DType::kF32, {static_cast<int64_t>(n)}, UpdateRule::kAdd, {}, -1};
  t.initial.assign(n * 4, 0);
  auto w = (*client)->Declare(t);
  if (!w.ok()) return w.status();
  TESSERA_RETURN_IF_ERROR((*client)->Initialize());
  auto stream = gpu::Stream::Create(0);
  if (!stream.ok()) return stream.status();
  auto grad = gpu::DeviceBuffer::Allocate(n * 4, 0);
  auto weights = gpu::DeviceBuffer::Allocate(n * 4, 0);
  if (!grad.ok() || !weights.ok()) return grad.ok() ? weights.status() : grad.status();
  std::vector<float> ones(n, 1.0f);
  TESSERA_RETURN_IF_ERROR(gpu::Copy(grad->data(), ones.data(), n * 4, *stream));
  TESSERA_RETURN_IF_ERROR(stream->Synchronize());
  int pushes = 0;
  auto t_push = Time(*stream, iters, [&]() -> Status {
    pushes++;
    return (*client)->Push({{*w, grad->data(), n * 4, DType::kF32}});
  });
  if (!t_push.ok()) return t_push.status();
  auto t_pull = Time(*stream, iters, [&] {
    return (*client)->Pull({{*w, weights->data(), n * 4, 1, DType::kF32}});
  });
  if (!t_pull.ok()) return t_pull.status();
  // Exact: every element is the number of pushes.
  std::vector<float> got(n);
  TESSERA_RETURN_IF_ERROR(gpu::Copy(got.data(), weights->data(), n * 4, *stream));
  TESSERA_RETURN_IF_ERROR(stream->Synchronize());
  const size_t wrong = static_cast<size_t>(std::count_if(
      got.begin(), got.end(), [&](float x) { return x != static_cast<float>(pushes); }));
  auto t_copy = Time(*stream, iters,
                     [&] { return gpu::Copy(weights->data(), grad->data(), n * 4, *stream); });
  if (!t_copy.ok()) return t_copy.status();
  const ClientCounters c = (*client)->counters();
  const double gb = static_cast<double>(bytes) / 1e9;
  return json{{"mode", "ipc"},
              {"bytes", bytes},
              {"push_GBps", gb / *t_push},
              {"pull_GBps", gb / *t_pull},
              {"memcpy_GBps", gb / *t_copy},
              {"push_ratio", *t_copy / *t_push},
              {"pull_ratio", *t_copy / *t_pull},
              {"exact", wrong == 0},
              {"wrong_elements", wrong},
              {"cuda_ipc_shards", c.cuda_ipc_shards},
              {"cuda_ipc_bytes", c.cuda_ipc_bytes},
              {"host_staged_bytes", c.host_staged_bytes},
              {"put_bytes", c.put_bytes},
              {"get_bytes", c.get_bytes}};
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) try {
  using namespace tessera;
  CLI::App app{"tessera-gpu-bench: GPU kernels and paths against the GPU's own copies"};
  app.require_subcommand(1);
  size_t elements = 1u << 26;
  int iters = 20;
  app.add_option("--iters", iters, "timed runs per figure (median)");
  auto* kern = app.add_subcommand("kernels", "update kernels vs cudaMemcpy of the same bytes");
  kern->add_option("--elements", elements, "elements per tensor");
  std::string dir;
  int steps = 10;
  Hyperparams h;
  h.learning_rate = 1e-3f;
  auto* adam = app.add_subcommand("adam", "Adam on tensors from files (see adam_vs_torch.py)");
  adam->add_option("--dir", dir, "param.f32 and grad.f32 in; tessera.f32 out")->required();
  adam->add_option("--elements", elements)->required();
  adam->add_option("--steps", steps);
  adam->add_option("--lr", h.learning_rate);
  adam->add_option("--beta1", h.beta1);
  adam->add_option("--beta2", h.beta2);
  adam->add_option("--eps", h.epsilon);
  adam->add_option("--weight-decay", h.weight_decay);
  std::string bin;
  size_t bytes = 256u << 20;
  auto* ipc = app.add_subcommand("ipc", "push/pull to a GPU shard process over CUDA IPC");
  ipc->add_option("--tessera", bin, "the tessera binary")->required();
  ipc->add_option("--bytes", bytes, "tensor size");
  CLI11_PARSE(app, argc, argv);

  if (Status st = gpu::Available(); !st.ok()) {
    fprintf(stderr, "tessera-gpu-bench: %s\n", st.message().c_str());
    return 77;  // skipped: no GPU
  }
  Result<nlohmann::json> out = Status::Internal("no mode");
  if (*kern) out = KernelsVsMemcpy(elements, iters);
  if (*adam) out = AdamFromFiles(dir, elements, steps, h, iters);
  if (*ipc) out = IpcPushPull(bin, bytes, iters);
  if (!out.ok()) {
    fprintf(stderr, "tessera-gpu-bench: %s\n", out.status().ToString().c_str());
    return 1;
  }
  auto desc = gpu::DescribeDevice(0);
  (*out)["device"] = desc.ok() ? *desc : desc.status().message();
  printf("%s\n", out->dump(2).c_str());
  return 0;
} catch (const std::exception& e) {
  fprintf(stderr, "tessera-gpu-bench: %s\n", e.what());
  return 1;
}
