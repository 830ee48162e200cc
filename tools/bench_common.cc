#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/secret.h"
#include "tools/bench_internal.h"
#include "tools/launch.h"
#include "transport/transport.h"

namespace tessera::tools::bench {

Stats Summarise(std::vector<double> us, uint64_t bytes) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.p50_us = us[us.size() / 2];
  s.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  s.gbps = s.p50_us > 0 ? static_cast<double>(bytes) / (s.p50_us * 1e3) : 0;
  return s;
}

nlohmann::json Row::ToJson() const {
  nlohmann::json j = {
      {"scenario", scenario},     {"transport", transport},     {"bytes", bytes},
      {"batch", batch},           {"shards", shards},           {"workers", workers},
      {"p50_us", tessera.p50_us}, {"p99_us", tessera.p99_us},   {"gbps", tessera.gbps},
      {"baseline", baseline},     {"baseline_us", baseline_us}, {"baseline_gbps", baseline_gbps},
      {"ratio", ratio},           {"ratio_of", ratio_of},       {"note", note}};
  if (allocs_per_op >= 0) j["allocs_per_op"] = allocs_per_op;
  return j;
}

void CompareBandwidth(Row* row, const std::string& test, const Perftest& p) {
  row->baseline = test;
  row->baseline_us = p.us;
  row->baseline_gbps = p.gbps;
  row->ratio = p.ok && p.gbps > 0 ? row->tessera.gbps / p.gbps : 0;
  row->ratio_of = "GB/s";
  row->note = p.error;
}

void CompareRoundTrip(Row* row, const Perftest& am_lat) {
  row->baseline = "2 x ucp_am_lat";
  row->baseline_us = 2 * am_lat.us;
  row->ratio = am_lat.ok && am_lat.us > 0 ? row->tessera.p50_us / (2 * am_lat.us) : 0;
  row->ratio_of = "time";
  row->note = am_lat.error;
}

std::string UcxTls(const std::string& transport) {
  if (transport == "shm") return "posix,sysv,cma,tcp";
  return transport;
}

std::string SizeName(uint64_t s) {
  if (s >= (1u << 20) && s % (1u << 20) == 0) return std::to_string(s >> 20) + " MiB";
  if (s >= 1024 && s % 1024 == 0) return std::to_string(s >> 10) + " KiB";
  return std::to_string(s) + " B";
}

namespace {
int NumCpus() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }
}  // namespace

Perftest RunPerftest(const std::string& tls, const std::string& test, uint64_t size, int iters,
                     int warmup, bool pin) {
  // perftest runs with the UCX settings Tessera gives itself (it inherits
  // this process's environment).
  transport::ApplyBackendDefaults("ucx");
  Perftest out;
  const int last = NumCpus() - 1;
  uint16_t port = FreePort("127.0.0.1");
  int server = SpawnProcess({"ucx_perftest", "-p", std::to_string(port)}, {"UCX_TLS=" + tls},
                            pin ? 0 : -1, /*quiet=*/true);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string cmd = fmt::format(
      "UCX_TLS={} timeout 120 {} ucx_perftest 127.0.0.1 -p {} -t {} -s {} -n {} -w {} -f "
      "2>/dev/null",
      tls, pin ? fmt::format("taskset -c {}", last) : "", port, test, size, iters, warmup);
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
  // With -f the last line is "iters typical avg overall bw_avg bw_overall
  // rate_avg rate_overall"; latency tests report one-way time (half a round trip).
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::istringstream in(text.substr(text.rfind('\n') + 1));
  double n = 0, typical = 0, avg = 0, overall = 0, bw_avg = 0, bw_overall = 0;
  if (rc != 0 || !(in >> n >> typical >> avg >> overall >> bw_avg >> bw_overall)) {
    out.error = "ucx_perftest " + test + " failed (exit " + std::to_string(rc) +
                "): " + text.substr(text.size() > 300 ? text.size() - 300 : 0);
    return out;
  }
  out.ok = true;
  out.us = test.find("lat") != std::string::npos ? typical : overall;
  out.gbps = bw_overall * 1048576.0 / 1e9;  // perftest's MB is 2^20 bytes
  return out;
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::Start(const BenchOptions& o,
                                                          const std::string& tls, int shards,
                                                          int workers) {
  if (!o.cluster_file.empty()) return Attach(o, workers);
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  std::vector<TaskAddress> ps, ws;
  for (int i = 0; i < shards; ++i) ps.push_back({"127.0.0.1", FreePort("127.0.0.1")});
  for (int i = 0; i < workers; ++i) ws.push_back({"127.0.0.1", FreePort("127.0.0.1")});
  ClusterSpec spec;
  TESSERA_RETURN_IF_ERROR(spec.AddJob("ps", ps));
  TESSERA_RETURN_IF_ERROR(spec.AddJob("worker", ws));
  auto hosts = [](const std::vector<TaskAddress>& v) {
    std::string s;
    for (const auto& a : v) s += (s.empty() ? "" : ",") + a.ToString();
    return s;
  };
  const std::string secret = GenerateSecret();
  const int cpus = NumCpus();
  for (int i = 0; i < shards; ++i) {
    std::vector<std::string> argv = {
        SelfExecutable(), "server", "--ps_hosts", hosts(ps),         "--worker_hosts", hosts(ws),
        "--job",          "ps",     "--task",     std::to_string(i), "--staging-mib",  "160"};
    if (o.busy_poll) argv.push_back("--busy-poll");
    // Shards on the first cores, the bench (workers) on the last one.
    const int cpu = o.pin ? (cpus > 1 ? i % (cpus - 1) : 0) : -1;
    c->shards_.push_back(SpawnProcess(
        argv, {"TESSERA_SECRET=" + secret, "TESSERA_LOG_LEVEL=warn", "UCX_TLS=" + tls}, cpu));
  }
  TESSERA_RETURN_IF_ERROR(c->ConnectWorkers(o, spec, secret, workers));
  return c;
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::Attach(const BenchOptions& o, int workers) {
  auto spec = ClusterSpec::FromJsonFile(o.cluster_file);
  if (!spec.ok()) return spec.status().WithContext("--cluster");
  auto secret = LoadSecret(o.secret_file);
  if (!secret.ok()) return secret.status();
  const int tasks = spec->num_tasks("worker");
  if (tasks < workers) {
    return Status::InvalidArgument("--workers " + std::to_string(workers) + " but " +
                                   o.cluster_file + " has " + std::to_string(tasks) +
                                   " worker tasks");
  }
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  TESSERA_RETURN_IF_ERROR(c->ConnectWorkers(o, *spec, *secret, workers));
  return c;
}

Status LocalCluster::ConnectWorkers(const BenchOptions& o, const ClusterSpec& spec,
                                    const std::string& secret, int workers) {
  for (int w = 0; w < workers; ++w) {
    ClientOptions copts;
    copts.cluster = spec;
    copts.task = {"worker", w};
    copts.secret = secret;
    copts.startup_timeout = std::chrono::seconds(30);
    copts.busy_poll = o.busy_poll;
    auto client = Client::Connect(copts);
    if (!client.ok()) return client.status();
    clients_.push_back(std::move(*client));
  }
  return Status::Ok();
}

LocalCluster::~LocalCluster() {
  clients_.clear();
  for (pid_t pid : shards_) kill(pid, SIGTERM);
  for (pid_t pid : shards_) waitpid(pid, nullptr, 0);
}

}  // namespace tessera::tools::bench
