#include "tools/bench.h"
#include "gpu/cuda.h"

#include <sched.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "tessera_config.h"
#include "tools/bench_internal.h"
#include "tools/cpu_hog.h"

namespace tessera::tools {
namespace {

using bench::Row;

const std::vector<std::string> kScenarios = {"fabric",    "push",           "pull",
                                             "push_pull", "push_then_pull", "step"};

void PrintTable(const std::vector<Row>& rows) {
  printf("%-15s %-10s %9s %5s %3s %3s | %10s %10s %9s %7s | %-31s %10s %9s | %7s %s\n", "scenario",
         "transport", "size", "batch", "S", "W", "p50 us", "p99 us", "GB/s", "alloc/op", "baseline",
         "base us", "base GB/s", "ratio", "");
  for (const auto& r : rows) {
    if (!r.load.empty() && r.load != "quiet") {
      // The loaded figure under its quiet one.
      printf(
          "%-15s %-10s %9s %5s %3s %3s | %10.1f %10.1f %9.3f %7s | beside a CPU hog: p50 %.2fx "
          "quiet%s\n",
          "  + cpu hog", "", "", "", "", "", r.tessera.p50_us, r.tessera.p99_us, r.tessera.gbps, "",
          r.vs_quiet, r.note.empty() ? "" : ("; " + r.note).c_str());
      continue;
    }
    // The worker's, then the shards' (after a slash) where they were counted.
    std::string allocs = r.allocs_per_op < 0 ? "-" : fmt::format("{:.1f}", r.allocs_per_op);
    if (r.shard_allocs_per_op >= 0) allocs += fmt::format("/{:.1f}", r.shard_allocs_per_op);
    std::string ratio = r.ratio > 0 ? fmt::format("{:.2f}", r.ratio) : "-";
    // The tails side by side, where the baseline has one.
    std::string tails;
    if (r.baseline_p99_us > 0 && r.baseline_us > 0 && r.tessera.p50_us > 0) {
      tails = fmt::format("p99/p50 {:.1f}, base {:.1f} (base p99 {:.1f} us) ",
                          r.tessera.p99_us / r.tessera.p50_us, r.baseline_p99_us / r.baseline_us,
                          r.baseline_p99_us);
    }
    printf(
        "%-15s %-10s %9s %5d %3d %3d | %10.1f %10.1f %9.3f %7s | %-31s %10.1f %9.3f | %7s "
        "%s%s%s\n",
        r.scenario.c_str(), r.transport.c_str(), bench::SizeName(r.bytes).c_str(), r.batch,
        r.shards, r.workers, r.tessera.p50_us, r.tessera.p99_us, r.tessera.gbps, allocs.c_str(),
        r.baseline.c_str(), r.baseline_us, r.baseline_gbps, ratio.c_str(),
        r.ratio > 0 ? (r.ratio_of == "time" ? "(time) " : "(GB/s) ") : "", tails.c_str(),
        r.note.c_str());
  }
}

// matplotlib from the project's virtual environment (tools/dev.sh makes it).
int Plot(const std::string& json_path, const std::string& png) {
  const std::string src = TESSERA_SOURCE_DIR;
  std::string python = src + "/.venv/bin/python";
  if (!std::filesystem::exists(python)) python = "python3";
  const std::string cmd =
      python + " " + src + "/tools/plot_bench.py '" + json_path + "' '" + png + "'";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    fprintf(stderr, "bench: plotting failed (%s); is matplotlib installed (tools/dev.sh)?\n",
            cmd.c_str());
    return 1;
  }
  fprintf(stderr, "bench: plot written to %s\n", png.c_str());
  return 0;
}

}  // namespace

namespace {

bool has_scenario(const BenchOptions& o, const char* name) {
  return std::find(o.scenarios.begin(), o.scenarios.end(), name) != o.scenarios.end();
}

}  // namespace

int RunBench(const BenchOptions& in) {
  BenchOptions o = in;
  if (o.scenarios.empty()) o.scenarios = {"push", "pull"};
  for (const auto& s : o.scenarios) {
    if (std::find(kScenarios.begin(), kScenarios.end(), s) == kScenarios.end()) {
      fprintf(
          stderr,
          "bench: unknown scenario '%s' (fabric, push, pull, push_pull, push_then_pull, step)\n",
          s.c_str());
      return 2;
    }
  }
  if (o.memory != "host" && o.memory != "cuda") {
    fprintf(stderr, "bench: --memory %s: expected host or cuda\n", o.memory.c_str());
    return 2;
  }
  if (o.memory == "cuda") {
    if (Status gpu_st = gpu::Available(); !gpu_st.ok()) {
      fprintf(stderr, "bench: --memory cuda: %s\n", gpu_st.message().c_str());
      return 2;
    }
    for (const auto& s : o.scenarios) {
      if (s == "fabric" || s == "step") {
        fprintf(stderr,
                "bench: --memory cuda measures push, pull and push_pull; %s uses host "
                "buffers (run it without --memory cuda)\n",
                s.c_str());
        return 2;
      }
    }
  }
  if (o.shards < 1 || o.workers < 1 || o.iters < 1 || o.warmup < 0) {
    fprintf(stderr, "bench: --shards, --workers and --iters must be at least 1\n");
    return 2;
  }
  for (const auto& t : o.transports) {
    if (t == "verbs" && (o.host.rfind("127.", 0) == 0 || o.host == "localhost")) {
      fprintf(stderr,
              "bench: --transport verbs needs --host with an address an RDMA device carries "
              "(rdma_cm cannot use loopback); `tessera doctor` lists them\n");
      return 2;
    }
  }
  if (!o.fabric_peer_netns.empty() && o.fabric_peer_host.empty()) {
    fprintf(stderr,
            "bench: --fabric-peer-netns needs --fabric-peer-host, the address the peer has in "
            "namespace %s\n",
            o.fabric_peer_netns.c_str());
    return 2;
  }
  if (!o.cluster_file.empty()) {
    if (has_scenario(o, "fabric")) {
      fprintf(stderr,
              "bench: the fabric scenario needs its own peer process; it is not run "
              "against a given --cluster\n");
      return 2;
    }
    auto spec = ClusterSpec::FromJsonFile(o.cluster_file);
    if (!spec.ok()) {
      fprintf(stderr, "bench: --cluster: %s\n", spec.status().ToString().c_str());
      return 2;
    }
    o.shards = spec->num_tasks("ps");  // for the tables
    if (o.baseline) {
      fprintf(stderr,
              "bench: note: with --cluster, ucx_perftest still runs on this host's loopback, not "
              "between the cluster's hosts; compare its figures with care\n");
    }
  }
  if (o.busy_poll) {
    // A busy poller never yields its core: more of them than cores, and the
    // figures measure the scheduler (8 ms p50 was seen), not Tessera.
    const int pollers = (o.cluster_file.empty() ? o.shards : 0) + o.workers;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (pollers > cores) {
      fprintf(stderr,
              "bench: warning: --busy-poll with %d busy polling processes and threads (%d shards, "
              "%d workers) on %d cores: each waits for a time slice, so the figures will show "
              "the scheduler, not Tessera. Use fewer shards and workers, or no --busy-poll\n",
              pollers, o.cluster_file.empty() ? o.shards : 0, o.workers, cores);
    }
  }
  if (o.pin) {
    // The bench and its worker threads on the last core; shards and peers
    // take the others.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(std::max(1u, std::thread::hardware_concurrency()) - 1, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  auto has = [&](const char* s) { return has_scenario(o, s); };
  std::vector<Row> rows;
  for (const auto& transport : o.transports) {
    const bench::Fabric fabric = bench::FabricFor(o, transport);
    if (fabric.backend == "verbs") {
      fprintf(stderr, "bench: verbs on %s\n", fabric.host.c_str());
    } else {
      fprintf(stderr, "bench: %s (%s; UCX_TLS=%s)\n", transport.c_str(), fabric.backend.c_str(),
              fabric.ucx_tls.c_str());
      setenv("UCX_TLS", fabric.ucx_tls.c_str(), 1);
    }
    auto measure = [&](std::vector<Row>* out) {
      Status st;
      if (has("fabric")) st = bench::RunFabric(o, fabric, out);
      if (st.ok()) st = bench::RunOps(o, fabric, out);
      if (st.ok() && has("step")) st = bench::RunStep(o, fabric, out);
      return st;
    };
    std::vector<Row> quiet;
    Status st = measure(&quiet);
    if (st.ok() && o.load) {
      std::vector<Row> loaded;
      {
        tools::CpuHog hog;
        fprintf(stderr, "bench: %s again beside a CPU hog (%d spinning processes)\n",
                transport.c_str(), hog.processes());
        st = measure(&loaded);
      }
      if (st.ok()) st = bench::PairWithQuiet(quiet, loaded, &rows);
    } else {
      rows.insert(rows.end(), quiet.begin(), quiet.end());
    }
    if (!st.ok()) {
      fprintf(stderr, "bench: %s: %s\n", transport.c_str(), st.ToString().c_str());
      PrintTable(rows);
      return 1;
    }
  }
  PrintTable(rows);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) out.push_back(r.ToJson());
  std::string json_path = o.json_path;
  if (json_path.empty() && !o.plot_path.empty()) json_path = o.plot_path + ".json";
  if (!json_path.empty()) {
    std::ofstream(json_path) << out.dump(2) << "\n";
    fprintf(stderr, "bench: results written to %s\n", json_path.c_str());
  }
  if (!o.plot_path.empty()) return Plot(json_path, o.plot_path);
  return 0;
}

}  // namespace tessera::tools
