#include "tools/bench.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/secret.h"
#include "tessera/client.h"
#include "tools/launch.h"

namespace tessera::tools {
namespace {

struct Stats {
  double p50_us = 0, p99_us = 0, gbps = 0;  // GB/s = 1e9 bytes/s, from the median
};

Stats Summarise(std::vector<double> us, uint64_t bytes) {
  std::sort(us.begin(), us.end());
  Stats s;
  s.p50_us = us[us.size() / 2];
  s.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  s.gbps = static_cast<double>(bytes) / (s.p50_us * 1e3);
  return s;
}

struct Perftest {
  bool ok = false;
  double p50_us = 0, gbps = 0;
  std::string error;
};

// ucx_perftest's client and server on the same cores and transport.
Perftest RunPerftest(const std::string& tls, const std::string& test, uint64_t size, int iters,
                     int warmup, bool pin) {
  Perftest out;
  uint16_t port = FreePort("127.0.0.1");
  std::vector<std::string> env = {"UCX_TLS=" + tls};
  int server =
      SpawnProcess({"ucx_perftest", "-p", std::to_string(port)}, env, pin ? 0 : -1, /*quiet=*/true);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string cmd = fmt::format(
      "UCX_TLS={} timeout 120 {} ucx_perftest 127.0.0.1 -p {} -t {} -s {} -n {} -w {} -f "
      "2>/dev/null",
      tls, pin ? "taskset -c 1" : "", port, test, size, iters, warmup);
  std::string text;
  int rc = 0;
  // The server may not listen yet on a loaded machine: retry a refused connect.
  for (int attempt = 0; attempt < 10; ++attempt) {
    text.clear();
    FILE* p = popen(cmd.c_str(), "r");
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) text.append(buf.data(), n);
    rc = pclose(p);
    if (rc == 0 || text.find("Connection refused") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  // With -f the last line is "iters p50 avg overall bw_avg bw_overall rate_avg rate_overall".
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::istringstream in(text.substr(text.rfind('\n') + 1));
  double n = 0, p50 = 0, avg = 0, overall = 0, bw_avg = 0, bw_overall = 0;
  if (rc != 0 || !(in >> n >> p50 >> avg >> overall >> bw_avg >> bw_overall)) {
    out.error = "ucx_perftest failed (exit " + std::to_string(rc) +
                "): " + text.substr(text.size() > 300 ? text.size() - 300 : 0);
    return out;
  }
  out.ok = true;
  out.p50_us = overall;                     // per-operation time over the whole run
  out.gbps = bw_overall * 1048576.0 / 1e9;  // perftest's MB is 2^20 bytes
  return out;
}

std::string SizeName(uint64_t s) {
  if (s >= (1u << 20) && s % (1u << 20) == 0) return std::to_string(s >> 20) + " MiB";
  if (s >= 1024 && s % 1024 == 0) return std::to_string(s >> 10) + " KiB";
  return std::to_string(s) + " B";
}

}  // namespace

int RunBench(const BenchOptions& options) {
  if (options.pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(1, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  nlohmann::json results = nlohmann::json::array();
  printf("%-20s %-9s | %10s %9s | %10s %9s | %12s %12s | %9s %9s\n", "transport", "size",
         "push p50us", "push GB/s", "pull p50us", "pull GB/s", "perf put GB/s", "perf get GB/s",
         "push/put", "pull/get");
  for (const auto& tls : options.tls) {
    setenv("UCX_TLS", tls.c_str(), 1);
    ClusterSpec spec;
    (void)spec.AddJob("ps", {{"127.0.0.1", FreePort("127.0.0.1")}});
    (void)spec.AddJob("worker", {{"127.0.0.1", FreePort("127.0.0.1")}});
    const std::string secret = GenerateSecret();
    int shard = SpawnProcess(
        {SelfExecutable(), "server", "--ps_hosts", spec.tasks("ps")[0].ToString(), "--worker_hosts",
         spec.tasks("worker")[0].ToString(), "--job", "ps", "--task", "0", "--staging-mib", "160"},
        {"TESSERA_SECRET=" + secret, "TESSERA_LOG_LEVEL=warn", "UCX_TLS=" + tls},
        options.pin ? 0 : -1);
    ClientOptions copts;
    copts.cluster = spec;
    copts.task = {"worker", 0};
    copts.secret = secret;
    copts.startup_timeout = std::chrono::seconds(20);
    auto client = Client::Connect(copts);
    if (!client.ok()) {
      fprintf(stderr, "bench: %s\n", client.status().ToString().c_str());
      kill(shard, SIGKILL);
      return 1;
    }
    std::vector<TensorSpec> specs;
    for (uint64_t size : options.sizes) {
      specs.push_back({"t" + std::to_string(size),
                       DType::kF32,
                       {static_cast<int64_t>(size / 4)},
                       UpdateRule::kAssign,
                       {},
                       -1});
    }
    auto tensors = (*client)->DeclareMany(specs);
    if (!tensors.ok() || !(*client)->Initialize().ok()) {
      fprintf(stderr, "bench: declare/init failed\n");
      kill(shard, SIGKILL);
      return 1;
    }
    for (size_t i = 0; i < options.sizes.size(); ++i) {
      const uint64_t size = options.sizes[i];
      std::vector<uint8_t> buf(size, 1);
      std::vector<double> push_us, pull_us;
      Tensor t = (*tensors)[i];
      for (int it = 0; it < options.warmup + options.iters; ++it) {
        auto t0 = std::chrono::steady_clock::now();
        Status st = (*client)->Push({{t, buf.data(), size, std::nullopt}});
        auto t1 = std::chrono::steady_clock::now();
        Status st2 = (*client)->Pull({{t, buf.data(), size, 1, std::nullopt}});
        auto t2 = std::chrono::steady_clock::now();
        if (!st.ok() || !st2.ok()) {
          fprintf(stderr, "bench: %s %s\n", st.ToString().c_str(), st2.ToString().c_str());
          kill(shard, SIGKILL);
          return 1;
        }
        if (it < options.warmup) continue;
        push_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        pull_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
      Stats push = Summarise(push_us, size), pull = Summarise(pull_us, size);
      Perftest put, get;
      if (options.baseline) {
        put = RunPerftest(tls, "ucp_put_bw", size, options.iters, options.warmup, options.pin);
        get = RunPerftest(tls, "ucp_get", size, options.iters, options.warmup, options.pin);
      }
      auto ratio = [](double a, const Perftest& b) {
        return b.ok && b.gbps > 0 ? a / b.gbps : 0.0;
      };
      printf("%-20s %-9s | %10.1f %9.3f | %10.1f %9.3f | %12.3f %12.3f | %9.3f %9.3f\n",
             tls.c_str(), SizeName(size).c_str(), push.p50_us, push.gbps, pull.p50_us, pull.gbps,
             put.gbps, get.gbps, ratio(push.gbps, put), ratio(pull.gbps, get));
      fflush(stdout);
      if (!put.error.empty()) fprintf(stderr, "  %s\n", put.error.c_str());
      if (!get.error.empty()) fprintf(stderr, "  %s\n", get.error.c_str());
      results.push_back({{"transport", tls},
                         {"bytes", size},
                         {"iters", options.iters},
                         {"push_p50_us", push.p50_us},
                         {"push_p99_us", push.p99_us},
                         {"push_gbps", push.gbps},
                         {"pull_p50_us", pull.p50_us},
                         {"pull_p99_us", pull.p99_us},
                         {"pull_gbps", pull.gbps},
                         {"perftest_put_gbps", put.gbps},
                         {"perftest_put_us", put.p50_us},
                         {"perftest_get_gbps", get.gbps},
                         {"perftest_get_us", get.p50_us}});
    }
    client->reset();
    kill(shard, SIGTERM);
    waitpid(shard, nullptr, 0);
  }
  if (!options.json_path.empty()) std::ofstream(options.json_path) << results.dump(2) << "\n";
  return 0;
}

}  // namespace tessera::tools
