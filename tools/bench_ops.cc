// push, pull and push_pull through real shard processes: latency and
// bandwidth over tensor sizes and batch sizes, beside ucx_perftest.
#include <fmt/format.h>
#include <algorithm>
#include <barrier>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "gpu/cuda.h"
#include "tools/bench_internal.h"

namespace tessera::tools::bench {
namespace {

// Fills `buf` with a pattern unique to (worker, tensor, iteration), so a
// check can tell any stale or misplaced byte.
void Pattern(std::vector<uint8_t>& buf, int worker, int tensor, int iter) {
  uint32_t x = static_cast<uint32_t>(worker * 7919 + tensor * 104729 + iter * 1299709 + 1);
  for (size_t i = 0; i + 4 <= buf.size(); i += 4) {
    x = x * 1664525u + 1013904223u;
    std::memcpy(&buf[i], &x, 4);
  }
}

struct Sample {
  std::vector<double> us;
  uint64_t allocations = 0;
  uint64_t ops = 0;
  Status status;
};

// --memory cuda's baseline: a device-to-device cudaMemcpy of `bytes`, median.
Perftest MemcpyBaseline(uint64_t bytes, int iters) {
  Perftest p;
  auto stream = gpu::Stream::Create(0);
  auto a = gpu::DeviceBuffer::Allocate(bytes, 0);
  auto b = gpu::DeviceBuffer::Allocate(bytes, 0);
  if (!stream.ok() || !a.ok() || !b.ok()) {
    p.error = !stream.ok() ? stream.status().message()
                           : (!a.ok() ? a.status().message() : b.status().message());
    return p;
  }
  std::vector<double> us;
  for (int i = -2; i < std::max(iters, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = gpu::Copy(b->data(), a->data(), bytes, *stream);
    if (st.ok()) st = stream->Synchronize();
    if (!st.ok()) {
      p.error = st.message();
      return p;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  p.ok = true;
  p.us = us[us.size() / 2];
  p.gbps = static_cast<double>(bytes) / (p.us * 1e3);
  return p;
}

// Sums the GPU counters of every worker.
ClientCounters GpuCounters(LocalCluster& c) {
  ClientCounters sum;
  for (int w = 0; w < c.num_workers(); ++w) {
    const ClientCounters x = c.worker(w).counters();
    sum.cuda_ipc_bytes += x.cuda_ipc_bytes;
    sum.host_staged_bytes += x.host_staged_bytes;
    sum.gpu_inline_bytes += x.gpu_inline_bytes;
  }
  return sum;
}

// Where one run measured both, push_pull's row says how many times faster
// it was than a push followed by a pull of the same tensors.
void NotePushPullGain(const std::string& transport, std::vector<Row>* rows) {
  for (Row& r : *rows) {
    if (r.scenario != "push_pull" || r.transport != transport || r.tessera.p50_us <= 0) continue;
    for (const Row& two : *rows) {
      if (two.scenario != "push_then_pull" || two.transport != transport || two.bytes != r.bytes ||
          two.batch != r.batch || two.load != r.load) {
        continue;
      }
      const std::string gain =
          fmt::format("{:.2f}x faster than push then pull", two.tessera.p50_us / r.tessera.p50_us);
      r.note = r.note.empty() ? gain : r.note + "; " + gain;
    }
  }
}

}  // namespace

Status RunOps(const BenchOptions& o, const Fabric& fabric, std::vector<Row>* rows) {
  const std::string& transport = fabric.name;
  std::vector<std::string> ops;
  for (const auto& s : o.scenarios) {
    if (s == "push" || s == "pull" || s == "push_pull" || s == "push_then_pull") ops.push_back(s);
  }
  if (ops.empty()) return Status::Ok();
  auto cluster = LocalCluster::Start(o, fabric, o.shards, o.workers);
  if (!cluster.ok()) return cluster.status().WithContext("starting the shards");
  LocalCluster& c = **cluster;

  // Every worker gets its own tensors (so --check knows every byte), all
  // declared before the chief initialises once.
  struct Set {
    uint64_t bytes;
    int batch;
    std::vector<std::vector<Tensor>> tensors;  // [worker][k]
  };
  std::vector<Set> sets;
  for (uint64_t size : o.sizes) {
    for (int batch : o.batches) {
      // Batches are about many small tensors: skip points of more than
      // 256 MiB a call (256 x 64 MiB would not fit the machine).
      if (batch > 1 && size * static_cast<uint64_t>(batch) > (256u << 20)) continue;
      Set set{std::max<uint64_t>(4, size / 4 * 4), batch, {}};
      for (int w = 0; w < c.num_workers(); ++w) {
        std::vector<TensorSpec> specs;
        for (int k = 0; k < batch; ++k) {
          specs.push_back({"w" + std::to_string(w) + ".s" + std::to_string(size) + ".b" +
                               std::to_string(batch) + "." + std::to_string(k),
                           DType::kF32,
                           {static_cast<int64_t>(set.bytes / 4)},
                           UpdateRule::kAssign,
                           {},
                           -1});
        }
        // The chief declares every worker's tensors too: it initialises
        // what it declared.
        if (w != 0) TESSERA_RETURN_IF_ERROR(c.worker(0).DeclareMany(specs).status());
        auto t = c.worker(w).DeclareMany(specs);
        if (!t.ok()) return t.status();
        set.tensors.push_back(std::move(*t));
      }
      sets.push_back(std::move(set));
    }
  }
  TESSERA_RETURN_IF_ERROR(c.worker(0).Initialize());
  for (int w = 1; w < c.num_workers(); ++w) TESSERA_RETURN_IF_ERROR(c.worker(w).WaitForInit());

  for (const auto& op : ops) {
    std::map<uint64_t, double> single_us;  // size -> this op's batch-1 p50, for the batch ratio
    for (const auto& set : sets) {
      std::vector<Sample> samples(static_cast<size_t>(c.num_workers()));
      // The shards' count starts when every worker has done its warmup
      // (--check adds pulls of its own: not counted then).
      const bool count_shards = !o.check;
      auto mark = [&]() noexcept {
        if (count_shards) c.MarkShardAllocations();
      };
      std::barrier warmed_up(c.num_workers(), mark);
      const bool on_gpu = o.memory == "cuda";
      const ClientCounters gpu_before = on_gpu ? GpuCounters(c) : ClientCounters{};
      auto run = [&](int w) {
        ArriveOnce arrival(warmed_up);
        Client& client = c.worker(w);
        Sample& s = samples[static_cast<size_t>(w)];
        const auto& ts = set.tensors[static_cast<size_t>(w)];
        std::vector<std::vector<uint8_t>> out(ts.size(), std::vector<uint8_t>(set.bytes));
        std::vector<std::vector<uint8_t>> in(ts.size(), std::vector<uint8_t>(set.bytes));
        // --memory cuda: the buffers the calls see are on the GPU; `out` and
        // `in` are their host images for --check.
        std::vector<gpu::DeviceBuffer> dout, din;
        gpu::Stream stream;
        if (on_gpu) {
          auto st = gpu::Stream::Create(0);
          if (!st.ok()) return void(s.status = st.status());
          stream = std::move(*st);
          dout.reserve(ts.size());
          din.reserve(ts.size());
          for (size_t k = 0; k < ts.size(); ++k) {
            auto a = gpu::DeviceBuffer::Allocate(set.bytes, 0);
            auto b = gpu::DeviceBuffer::Allocate(set.bytes, 0);
            if (!a.ok() || !b.ok()) return void(s.status = a.ok() ? b.status() : a.status());
            dout.push_back(std::move(*a));
            din.push_back(std::move(*b));
          }
        }
        auto src = [&](size_t k) -> uint8_t* {
          return on_gpu ? static_cast<uint8_t*>(dout[k].data()) : out[k].data();
        };
        auto dst = [&](size_t k) -> uint8_t* {
          return on_gpu ? static_cast<uint8_t*>(din[k].data()) : in[k].data();
        };
        std::vector<PushItem> push;
        std::vector<PullItem> pull;
        std::vector<PushPullItem> push_pull;
        for (size_t k = 0; k < ts.size(); ++k) {
          push.push_back({ts[k], src(k), set.bytes, std::nullopt});
          pull.push_back({ts[k], dst(k), set.bytes, 1, std::nullopt});
          push_pull.push_back({ts[k], src(k), dst(k), set.bytes});
        }
        for (int it = 0; it < o.warmup + o.iters; ++it) {
          if (it == o.warmup) arrival.Now();
          if (o.gap_us > 0) {
            // Busy, as compute is: the core stays this thread's.
            const auto resume =
                std::chrono::steady_clock::now() + std::chrono::microseconds(o.gap_us);
            while (std::chrono::steady_clock::now() < resume) {
            }
          }
          if (o.check) {
            for (size_t k = 0; k < ts.size(); ++k) {
              Pattern(out[k], w, static_cast<int>(k), it);
              if (!on_gpu) continue;
              Status up = gpu::Copy(dout[k].data(), out[k].data(), set.bytes, stream);
              if (up.ok()) up = stream.Synchronize();
              if (!up.ok()) return void(s.status = up);
            }
          }
          const uint64_t a0 = HeapAllocations();
          const auto t0 = std::chrono::steady_clock::now();
          Status st;
          if (op == "push") {
            st = client.Push(push);
          } else if (op == "pull") {
            st = client.Pull(pull);
          } else if (op == "push_then_pull") {
            // What push_pull saves: the same work as two calls.
            st = client.Push(push);
            if (st.ok()) st = client.Pull(pull);
          } else {
            st = client.PushPull(push_pull);
          }
          const auto t1 = std::chrono::steady_clock::now();
          const uint64_t a1 = HeapAllocations();
          if (!st.ok()) {
            s.status = st;
            return;
          }
          if (o.check && op != "pull") {
            if (op == "push") st = client.Pull(pull);
            for (size_t k = 0; on_gpu && st.ok() && k < ts.size(); ++k) {
              st = gpu::Copy(in[k].data(), din[k].data(), set.bytes, stream);
              if (st.ok()) st = stream.Synchronize();
            }
            for (size_t k = 0; st.ok() && k < ts.size(); ++k) {
              if (in[k] != out[k]) {
                st = Status::DataLoss(op + " of " + SizeName(set.bytes) + ": tensor " +
                                      std::to_string(k) + " of worker " + std::to_string(w) +
                                      " came back different");
              }
            }
            if (!st.ok()) {
              s.status = st;
              return;
            }
          }
          if (it < o.warmup) continue;
          s.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          s.allocations += a1 - a0;
          s.ops++;
        }
      };
      std::vector<std::thread> threads;
      for (int w = 0; w < c.num_workers(); ++w) threads.emplace_back(run, w);
      for (auto& t : threads) t.join();
      std::vector<double> all;
      uint64_t allocations = 0, n = 0;
      for (const auto& s : samples) {
        if (!s.status.ok()) return s.status;
        all.insert(all.end(), s.us.begin(), s.us.end());
        allocations += s.allocations;
        n += s.ops;
      }
      // Bandwidth: every worker's bytes per median call.
      const uint64_t call_bytes = set.bytes * static_cast<uint64_t>(set.batch) *
                                  (op == "push_pull" || op == "push_then_pull" ? 2 : 1) *
                                  static_cast<uint64_t>(c.num_workers());
      Row row{op,
              transport,
              set.bytes,
              set.batch,
              o.shards,
              c.num_workers(),
              Summarise(all, call_bytes)};
      // Every worker's thread counts: an upper bound per call with W > 1.
      row.allocs_per_op = n ? static_cast<double>(allocations) / static_cast<double>(n) : -1;
      if (count_shards) {
        if (auto shard = c.ShardAllocationsPerCall(n)) row.shard_allocs_per_op = *shard;
      }
      if (set.batch == 1) single_us[set.bytes] = row.tessera.p50_us;
      if (set.batch > 1 && single_us.count(set.bytes)) {
        row.note = "batch/1 = " + std::to_string(row.tessera.p50_us / single_us[set.bytes]);
      }
      if (on_gpu) {
        const ClientCounters after = GpuCounters(c);
        const uint64_t ipc = after.cuda_ipc_bytes - gpu_before.cuda_ipc_bytes;
        const uint64_t staged = after.host_staged_bytes - gpu_before.host_staged_bytes;
        const uint64_t inl = after.gpu_inline_bytes - gpu_before.gpu_inline_bytes;
        row.gpu_path = ipc > 0      ? "CUDA IPC"
                       : staged > 0 ? "host-staged"
                       : inl > 0    ? "inline"
                                    : "fabric";
        // Per timed or untimed call, checks included: an upper bound.
        const double calls = static_cast<double>(o.warmup + o.iters) * c.num_workers();
        row.host_staged_bytes_per_op = static_cast<double>(staged) / calls;
        row.note = "GPU buffers: " + row.gpu_path;
      }
      if (o.baseline && set.batch == 1 && c.num_workers() == 1 && on_gpu) {
        if (set.bytes > 65536) {
          CompareBandwidth(&row, "cudaMemcpy D2D", MemcpyBaseline(set.bytes, o.iters));
          row.note = "GPU buffers: " + row.gpu_path + (row.note.empty() ? "" : "; " + row.note);
        }
      } else if (o.baseline && set.batch == 1 && c.num_workers() == 1 && fabric.backend == "tcp") {
        // Plain sockets make the call's own exchange: push sends N bytes
        // and reads 8, pull the reverse, push_pull (and push_then_pull) N
        // each way.
        const uint64_t b = set.bytes;
        const bool both_ways = op == "push_pull" || op == "push_then_pull";
        const Baseline kind = op == "pull" ? Baseline::kGet
                              : both_ways  ? Baseline::kMessageLatency
                                           : Baseline::kPut;
        const Perftest p =
            RunBaseline(fabric, kind, b, b <= 65536 ? o.iters * 10 : o.iters, o.warmup, o.pin);
        if (b <= 65536) {
          CompareRoundTrip(&row, BaselineName(fabric, kind), p);
        } else {
          CompareBandwidth(&row, BaselineName(fabric, kind), p);
        }
      } else if (o.baseline && set.batch == 1 && c.num_workers() == 1) {
        const uint64_t b = set.bytes;
        if (b <= 65536) {
          // Small: a Tessera call is one round trip; compare with the fabric's.
          auto lat =
              RunBaseline(fabric, Baseline::kMessageLatency, b, o.iters * 10, o.warmup, o.pin);
          CompareRoundTrip(&row, BaselineName(fabric, Baseline::kMessageLatency), lat);
        } else {
          const Baseline kind = op == "pull" ? Baseline::kGet : Baseline::kPut;
          CompareBandwidth(&row, BaselineName(fabric, kind),
                           RunBaseline(fabric, kind, b, o.iters, o.warmup, o.pin));
        }
      }
      rows->push_back(row);
      fprintf(stderr, "  %s %s %s x%d done\n", transport.c_str(), op.c_str(),
              SizeName(set.bytes).c_str(), set.batch);
    }
  }
  NotePushPullGain(transport, rows);
  return Status::Ok();
}

}  // namespace tessera::tools::bench
