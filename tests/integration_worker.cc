// A worker of the multi-process integration test, started by `tessera launch`
// (or by hand with TF_CONFIG): declares 200 tensors of mixed dtypes and sizes
// (1 element to 8 MiB, the large ones chunked), pushes `add` updates
// concurrently with the other workers, and checks the final values against
// the exact expected sums. Exits 0 only if every byte matches.
//
// As TensorFlow's evaluator (TF_CONFIG task "evaluator", which need not be in
// the cluster) it is a read-only client: it looks the same tensors up,
// checks that a push is refused, and waits for the workers' every round to
// check the same exact sums.
//
// With --sync-steps N it trains sync tensors instead (every worker's push
// per step, then a pull of that step), checks the exact sums, and the chief
// waits for global step N; with --status-json FILE the chief then writes
// what `tessera status --json` ($TESSERA_BIN) says of the running cluster.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/dtype.h"
#include "core/log.h"
#include "core/secret.h"
#include "kernels/update.h"
#include "tessera/client.h"

namespace {

using namespace tessera;

struct Plan {
  std::string name;
  DType dtype;
  uint64_t elems;
};

std::vector<Plan> MakePlan(int count, uint64_t big_bytes) {
  const DType dtypes[] = {DType::kF32,  DType::kF64, DType::kF16,
                          DType::kBF16, DType::kI32, DType::kI64};
  const uint64_t sizes[] = {1, 2, 7, 64, 1000, 4097, 20000, 65536};
  std::vector<Plan> plan;
  for (int i = 0; i < count; ++i) {
    DType dt = dtypes[i % 6];
    uint64_t elems = sizes[(i / 6) % 8];
    if (i % 50 == 0) elems = big_bytes / DTypeSize(dt);  // 4 large tensors, chunked
    plan.push_back({"layer" + std::to_string(i) + "/" + DTypeName(dt), dt, elems});
  }
  return plan;
}

// Small integers: every dtype holds the sums exactly.
void Fill(DType dt, uint64_t n, const std::function<int(uint64_t)>& value,
          std::vector<uint8_t>* out) {
  out->assign(n * DTypeSize(dt), 0);
  for (uint64_t j = 0; j < n; ++j) StoreAs(dt, value(j), out->data() + j * DTypeSize(dt));
}

int Delta(uint64_t j, int worker, int round) {
  return static_cast<int>((j + static_cast<uint64_t>(worker + round)) % 3) + 1;
}

int Fail(const std::string& what, const Status& st) {
  fprintf(stderr, "integration_worker: %s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

// Sync training: `tensors` f64 tensors of 64 elements, sync over every
// worker; step s adds (rank + s) % 4 + 1 from each worker to every element.
int SyncSteps(Client& c, const std::string& task, int me, int workers, uint64_t steps, int tensors,
              const std::string& status_json) {
  constexpr int64_t kElems = 64;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < tensors; ++i) {
    TensorSpec s{"sync" + std::to_string(i), DType::kF64, {kElems}, UpdateRule::kAdd, {}, -1};
    s.mode = ConsistencyMode::Sync(static_cast<uint32_t>(workers), static_cast<uint32_t>(workers),
                                   false);
    specs.push_back(std::move(s));
  }
  auto handles = c.DeclareMany(specs);
  if (!handles.ok()) return Fail("declare", handles.status());
  Status st = c.is_chief() ? c.Initialize() : c.WaitForInit(std::chrono::seconds(60));
  if (!st.ok()) return Fail("init", st);
  std::vector<std::vector<double>> values(specs.size(), std::vector<double>(kElems));
  for (uint64_t s = 0; s < steps; ++s) {
    const std::vector<double> grad(kElems, static_cast<double>((me + s) % 4 + 1));
    std::vector<PushItem> push;
    std::vector<PullItem> pull;
    for (size_t i = 0; i < specs.size(); ++i) {
      push.push_back(PushItem::Of<double>((*handles)[i], grad));
      pull.push_back(PullItem::AfterStep<double>((*handles)[i], values[i], s + 1));
    }
    st = c.Push(push, {.step = s});
    if (st.ok()) st = c.Pull(pull);
    if (!st.ok()) return Fail("step " + std::to_string(s), st);
  }
  double expect = 0;
  for (uint64_t s = 0; s < steps; ++s) {
    for (int w = 0; w < workers; ++w) expect += static_cast<double>((w + s) % 4 + 1);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (values[i] != std::vector<double>(kElems, expect)) {
      fprintf(stderr, "integration_worker: %s differs from the expected sum %.0f\n",
              specs[i].name.c_str(), expect);
      return 1;
    }
  }
  printf("%s verified %zu sync tensors after %llu steps\n", task.c_str(), specs.size(),
         static_cast<unsigned long long>(steps));
  if (!c.is_chief()) return 0;
  // The shards report steps after the pushes returned: wait for the count.
  uint64_t global = 0;
  for (int i = 0; i < 1000 && global < steps; ++i) {
    auto g = c.GlobalStep();
    if (!g.ok()) return Fail("global step", g.status());
    global = *g;
    if (global < steps) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (global != steps) {
    fprintf(stderr, "integration_worker: global step %llu, expected %llu\n",
            static_cast<unsigned long long>(global), static_cast<unsigned long long>(steps));
    return 1;
  }
  if (status_json.empty()) return 0;
  const char* bin = std::getenv("TESSERA_BIN");
  if (bin == nullptr) return Fail("status", Status::InvalidArgument("TESSERA_BIN is not set"));
  std::string cmd = std::string(bin) + " status --json";
  if (const char* transport = std::getenv("TESSERA_TRANSPORT")) {
    cmd += std::string(" --transport ") + transport;
  }
  cmd += " > '" + status_json + "'";
  if (std::system(cmd.c_str()) != 0) {
    return Fail("status", Status::Internal("`" + cmd + "` failed"));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tessera integration test worker"};
  int rounds = 2, tensors = 200;
  uint64_t big_mib = 8, chunk_kib = 1024, sync_steps = 0;
  std::string status_json;
  app.add_option("--sync-steps", sync_steps, "train sync tensors for this many steps instead");
  app.add_option("--status-json", status_json,
                 "with --sync-steps: the chief writes `tessera status --json` here at the end");
  app.add_option("--rounds", rounds);
  app.add_option("--tensors", tensors);
  app.add_option("--big-mib", big_mib);
  app.add_option("--chunk-kib", chunk_kib);
  CLI11_PARSE(app, argc, argv);

  auto cfg = TfConfigFromEnv();
  if (!cfg.ok()) return Fail("TF_CONFIG", cfg.status());
  if (Status st = InitLogging(cfg->task.job + std::to_string(cfg->task.index)); !st.ok()) {
    return Fail("logging", st);
  }
  auto secret = LoadSecret();
  if (!secret.ok()) return Fail("secret", secret.status());
  const int workers = cfg->cluster.num_workers();
  const bool evaluator = cfg->task.job == "evaluator";
  const int me = evaluator ? -1 : cfg->cluster.worker_rank(cfg->task).value();

  ClientOptions opts;
  opts.cluster = cfg->cluster;
  opts.task = cfg->task;
  opts.secret = *secret;
  opts.read_only = evaluator;
  opts.chunk_bytes = chunk_kib << 10;
  opts.op_timeout = std::chrono::seconds(120);
  if (const char* transport = std::getenv("TESSERA_TRANSPORT")) opts.transport = transport;
  auto client = Client::Connect(opts);
  if (!client.ok()) return Fail("connect", client.status());
  Client& c = **client;
  if (sync_steps > 0)
    return SyncSteps(c, cfg->task.ToString(), me, workers, sync_steps, 8, status_json);

  auto plan = MakePlan(tensors, big_mib << 20);
  std::vector<TensorSpec> specs;
  for (const auto& p : plan) {
    TensorSpec s{p.name, p.dtype, {static_cast<int64_t>(p.elems)}, UpdateRule::kAdd, {}, -1};
    Fill(
        p.dtype, p.elems, [](uint64_t j) { return static_cast<int>(j % 5); }, &s.initial);
    specs.push_back(std::move(s));
  }
  // An evaluator looks up what the chief declared: it waits for init first.
  Status st = evaluator ? c.WaitForInit(std::chrono::seconds(120)) : Status::Ok();
  if (!st.ok()) return Fail("init", st);
  auto handles = c.DeclareMany(specs);
  if (!handles.ok()) return Fail("declare", handles.status());
  if (!evaluator) st = c.is_chief() ? c.Initialize() : c.WaitForInit(std::chrono::seconds(60));
  if (!st.ok()) return Fail("init", st);

  // Every round pushes all tensors in one batched call; odd rounds use push_pull.
  std::vector<std::vector<uint8_t>> grads(plan.size()), scratch(plan.size());
  if (evaluator) {
    for (size_t i = 0; i < plan.size(); ++i) grads[i].resize(specs[i].initial.size());
    Status refused = c.Push({{(*handles)[0], grads[0].data(), grads[0].size(), plan[0].dtype}});
    if (refused.code() != StatusCode::kFailedPrecondition) {
      return Fail("an evaluator's push was not refused", refused);
    }
  }
  for (int r = 0; r < rounds && !evaluator; ++r) {
    std::vector<PushItem> push;
    std::vector<PushPullItem> push_pull;
    for (size_t i = 0; i < plan.size(); ++i) {
      Fill(
          plan[i].dtype, plan[i].elems, [&](uint64_t j) { return Delta(j, me, r); }, &grads[i]);
      scratch[i].resize(grads[i].size());
      push.push_back({(*handles)[i], grads[i].data(), grads[i].size(), plan[i].dtype});
      push_pull.push_back(
          {(*handles)[i], grads[i].data(), scratch[i].data(), grads[i].size(), plan[i].dtype});
    }
    st = (r % 2 == 0) ? c.PushAsync(std::move(push)).Wait()
                      : c.PushPullAsync(std::move(push_pull)).Wait();
    if (!st.ok()) return Fail("round " + std::to_string(r), st);
  }

  // Wait for every worker's every round, then compare byte for byte.
  const uint64_t final_version = 1 + static_cast<uint64_t>(workers * rounds);
  std::vector<std::vector<uint8_t>> got(plan.size());
  std::vector<PullItem> pull;
  for (size_t i = 0; i < plan.size(); ++i) {
    got[i].assign(grads[i].size(), 0xcd);
    pull.push_back({(*handles)[i], got[i].data(), got[i].size(), final_version, plan[i].dtype});
  }
  st = c.PullAsync(std::move(pull)).Wait();
  if (!st.ok()) return Fail("final pull", st);
  size_t bad = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    std::vector<uint8_t> expect;
    Fill(
        plan[i].dtype, plan[i].elems,
        [&](uint64_t j) {
          int v = static_cast<int>(j % 5);
          for (int w = 0; w < workers; ++w) {
            for (int r = 0; r < rounds; ++r) v += Delta(j, w, r);
          }
          return v;
        },
        &expect);
    if (expect != got[i]) {
      if (bad++ < 5)
        fprintf(stderr, "integration_worker: %s differs from the expected sum\n",
                plan[i].name.c_str());
    }
  }
  if (bad) {
    fprintf(stderr, "integration_worker: %zu of %zu tensors wrong\n", bad, plan.size());
    return 1;
  }
  uint64_t bytes = 0;
  for (const auto& g : grads) bytes += g.size();
  auto counters = c.counters();
  printf(
      "%s verified %zu tensors (%.1f MiB) after %d rounds of %d workers; one-sided %.1f MiB put, "
      "%.1f MiB get, %.1f KiB in messages\n",
      cfg->task.ToString().c_str(), plan.size(), static_cast<double>(bytes) / (1 << 20), rounds,
      workers, static_cast<double>(counters.put_bytes) / (1 << 20),
      static_cast<double>(counters.get_bytes) / (1 << 20),
      static_cast<double>(counters.message_bytes_sent) / 1024);
  return 0;
}
