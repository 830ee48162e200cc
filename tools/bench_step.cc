// A synchronous training step of a real model's tensor list: every worker
// pushes every gradient for step t and pulls every weight after step t,
// against the bound of moving those bytes at the fabric's own bandwidth, a
// put the receiver then reads (fabric-put-read).
#include <barrier>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessera_config.h"
#include "tools/bench_internal.h"

namespace tessera::tools::bench {
namespace {

struct ModelTensor {
  std::string name;
  Shape shape;
};

Result<std::vector<ModelTensor>> LoadModel(const std::string& model) {
  std::string path = model;
  if (path.find('/') == std::string::npos) {
    path = std::string(TESSERA_SOURCE_DIR) + "/bench/models/" + model + ".txt";
  }
  std::ifstream in(path);
  if (!in) return Status::NotFound("no model file " + path);
  std::vector<ModelTensor> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    lineno++;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    ModelTensor t;
    std::string dims;
    if (!(fields >> t.name >> dims)) {
      return Status::InvalidArgument(path + ":" + std::to_string(lineno) + ": want NAME D1,D2,...");
    }
    std::istringstream ds(dims);
    std::string d;
    while (std::getline(ds, d, ',')) t.shape.push_back(std::stoll(d));
    out.push_back(std::move(t));
  }
  if (out.empty()) return Status::InvalidArgument(path + " lists no tensors");
  return out;
}

}  // namespace

Status RunStep(const BenchOptions& o, const Fabric& fabric, std::vector<Row>* rows) {
  const std::string& transport = fabric.name;
  auto model = LoadModel(o.model);
  if (!model.ok()) return model.status();
  uint64_t model_bytes = 0;
  std::vector<TensorSpec> specs;
  for (const auto& t : *model) {
    TensorSpec s{t.name, DType::kF32, t.shape, UpdateRule::kSgd, {}, -1};
    s.mode =
        ConsistencyMode::Sync(static_cast<uint32_t>(o.workers), static_cast<uint32_t>(o.workers));
    model_bytes += NumElements(t.shape).value() * 4;
    specs.push_back(std::move(s));
  }
  // The bound: each worker moves the model up and down once per step at the
  // bandwidth of a put the receiver then reads, for as many bytes as the
  // model (streaming from memory, not from cache), measured now. A bare
  // put's bound is kept in the note: no push can reach it, because the
  // shard must read what it applies.
  auto fabric_bw = MeasureFabricBandwidth(o, fabric, std::min<uint64_t>(model_bytes, 512u << 20));
  if (!fabric_bw.ok()) return fabric_bw.status().WithContext("measuring the fabric");

  auto cluster = LocalCluster::Start(o, fabric, o.shards, o.workers);
  if (!cluster.ok()) return cluster.status().WithContext("starting the shards");
  LocalCluster& c = **cluster;
  std::vector<std::vector<Tensor>> tensors;
  for (int w = 0; w < c.num_workers(); ++w) {
    auto t = c.worker(w).DeclareMany(specs);
    if (!t.ok()) return t.status();
    tensors.push_back(std::move(*t));
  }
  TESSERA_RETURN_IF_ERROR(c.worker(0).Initialize());
  for (int w = 1; w < c.num_workers(); ++w) TESSERA_RETURN_IF_ERROR(c.worker(w).WaitForInit());

  std::vector<std::vector<double>> us(static_cast<size_t>(c.num_workers()));
  std::vector<Status> status(static_cast<size_t>(c.num_workers()));
  // Allocations are counted from the first timed step, when every worker
  // has done its warmup: the process's count (every worker's thread and the
  // clients' own), and the shards' from their status, per worker and step.
  uint64_t allocations_before = 0;
  auto mark = [&]() noexcept {
    c.MarkShardAllocations();  // asking the shards allocates here too: before the count starts
    allocations_before = HeapAllocations();
  };
  std::barrier warmed_up(c.num_workers(), mark);
  auto run = [&](int w) {
    ArriveOnce arrival(warmed_up);
    Client& client = c.worker(w);
    const auto& ts = tensors[static_cast<size_t>(w)];
    std::vector<std::vector<float>> grads, weights;
    std::vector<PushItem> push;
    std::vector<PullItem> pull;
    us[static_cast<size_t>(w)].reserve(static_cast<size_t>(o.iters));
    for (size_t k = 0; k < ts.size(); ++k) {
      const uint64_t n = NumElements(specs[k].shape).value();
      grads.emplace_back(n, 1e-4f);
      weights.emplace_back(n);
    }
    for (size_t k = 0; k < ts.size(); ++k) {
      push.push_back(PushItem::Of<float>(ts[k], grads[k]));
      pull.push_back(PullItem::Of<float>(ts[k], weights[k]));
    }
    for (int step = 0; step < o.warmup + o.iters; ++step) {
      if (step == o.warmup) arrival.Now();
      for (auto& p : pull) p.min_step = static_cast<uint64_t>(step) + 1;
      const auto t0 = std::chrono::steady_clock::now();
      Status st = client.Push(push, {.step = static_cast<uint64_t>(step)});
      if (st.ok()) st = client.Pull(pull);
      const auto t1 = std::chrono::steady_clock::now();
      if (!st.ok()) {
        status[static_cast<size_t>(w)] = st;
        return;
      }
      if (step >= o.warmup) {
        us[static_cast<size_t>(w)].push_back(
            std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < c.num_workers(); ++w) threads.emplace_back(run, w);
  for (auto& t : threads) t.join();
  const uint64_t allocations = HeapAllocations() - allocations_before;
  std::vector<double> all;
  for (int w = 0; w < c.num_workers(); ++w) {
    if (!status[static_cast<size_t>(w)].ok()) return status[static_cast<size_t>(w)];
    all.insert(all.end(), us[static_cast<size_t>(w)].begin(), us[static_cast<size_t>(w)].end());
  }
  Row row{"step",
          transport,
          model_bytes,
          static_cast<int>(specs.size()),
          o.shards,
          c.num_workers(),
          Summarise(all, 2 * model_bytes)};
  const uint64_t worker_steps = static_cast<uint64_t>(o.iters) * c.num_workers();
  if (worker_steps > 0) {
    row.allocs_per_op = static_cast<double>(allocations) / static_cast<double>(worker_steps);
    if (auto shard = c.ShardAllocationsPerCall(worker_steps)) row.shard_allocs_per_op = *shard;
  }
  row.baseline = "bound (2 x model / fabric-put-read)";
  row.baseline_gbps = fabric_bw->put_read_gbps;
  row.baseline_us = static_cast<double>(2 * model_bytes) / (fabric_bw->put_read_gbps * 1e3);
  row.ratio = row.tessera.p50_us / row.baseline_us;
  row.ratio_of = "time";
  const double put_bound_us = static_cast<double>(2 * model_bytes) / (fabric_bw->put_gbps * 1e3);
  char put_note[96];
  std::snprintf(put_note, sizeof(put_note), "; %.2fx a bare put's bound (%.1f GB/s)",
                row.tessera.p50_us / put_bound_us, fabric_bw->put_gbps);
  row.note = o.model + ", " + std::to_string(specs.size()) + " tensors" + put_note;
  rows->push_back(row);
  return Status::Ok();
}

}  // namespace tessera::tools::bench
