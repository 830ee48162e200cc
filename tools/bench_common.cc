#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/log.h"
#include "core/ports.h"
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
  if (baseline_p99_us > 0) j["baseline_p99_us"] = baseline_p99_us;
  if (allocs_per_op >= 0) j["allocs_per_op"] = allocs_per_op;
  if (shard_allocs_per_op >= 0) j["shard_allocs_per_op"] = shard_allocs_per_op;
  if (!load.empty()) {
    j["load"] = load;
    if (vs_quiet > 0) j["p50_vs_quiet"] = vs_quiet;
  }
  if (!gpu_path.empty()) {
    j["gpu_path"] = gpu_path;
    j["host_staged_bytes_per_op"] = host_staged_bytes_per_op;
  }
  return j;
}

Status PairWithQuiet(const std::vector<Row>& quiet, const std::vector<Row>& loaded,
                     std::vector<Row>* rows) {
  if (quiet.size() != loaded.size()) {
    return Status::Internal("the loaded run measured " + std::to_string(loaded.size()) +
                            " points, the quiet one " + std::to_string(quiet.size()));
  }
  for (size_t i = 0; i < quiet.size(); ++i) {
    Row q = quiet[i], l = loaded[i];
    q.load = "quiet";
    l.load = "hog";
    l.vs_quiet = q.tessera.p50_us > 0 ? l.tessera.p50_us / q.tessera.p50_us : 0;
    // A wake-up that waits for the scheduler's tick shows as a p50 on a
    // whole number of milliseconds (1, 4 or 10 ms ticks), far above quiet.
    const double ms = l.tessera.p50_us / 1000;
    if (ms >= 0.95 && l.vs_quiet >= 5 && std::abs(ms - std::round(ms)) < 0.03 * ms) {
      l.note = "CLIFF: p50 on a whole number of ms, " + fmt::format("{:.0f}", l.vs_quiet) +
               "x quiet: a wake-up waiting for a clock tick?";
    }
    rows->push_back(std::move(q));
    rows->push_back(std::move(l));
  }
  return Status::Ok();
}

void CompareBandwidth(Row* row, const std::string& test, const Perftest& p) {
  row->baseline = test;
  row->baseline_us = p.us;
  row->baseline_p99_us = p.p99_us;
  row->baseline_gbps = p.gbps;
  row->ratio = p.ok && p.gbps > 0 ? row->tessera.gbps / p.gbps : 0;
  row->ratio_of = "GB/s";
  row->note = p.error;
}

void CompareRoundTrip(Row* row, const std::string& test, const Perftest& lat) {
  // perftest's latency tests report one way; a round trip is two of them.
  const double round_trip = lat.round_trip ? lat.us : 2 * lat.us;
  row->baseline = lat.round_trip ? test : "2 x " + test;
  row->baseline_us = round_trip;
  row->baseline_p99_us = lat.round_trip ? lat.p99_us : 0;
  row->ratio = lat.ok && round_trip > 0 ? row->tessera.p50_us / round_trip : 0;
  row->ratio_of = "time";
  row->note = lat.error;
}

Fabric FabricFor(const BenchOptions& o, const std::string& transport) {
  Fabric f;
  f.name = transport;
  f.host = o.host;
  if (transport == "verbs") {
    f.backend = "verbs";
    return f;
  }
  if (transport == "tcp" || transport == "tcp-protected" || transport == "tcp-integrity") {
    // Tessera's own sockets; the raw-fabric baseline is plain sockets. On
    // loopback sessions are unprotected unless asked.
    f.backend = "tcp";
    f.ucx_tls = "tcp";
    f.protection = transport == "tcp-protected"   ? "on"
                   : transport == "tcp-integrity" ? "integrity"
                                                  : "auto";
    return f;
  }
  f.backend = "ucx";
  f.ucx_tls = transport == "shm"       ? "posix,sysv,cma,tcp"
              : transport == "ucx-tcp" ? "tcp"
                                       : transport;
  return f;
}

std::string SizeName(uint64_t s) {
  if (s >= (1u << 20) && s % (1u << 20) == 0) return std::to_string(s >> 20) + " MiB";
  if (s >= 1024 && s % 1024 == 0) return std::to_string(s >> 10) + " KiB";
  return std::to_string(s) + " B";
}

namespace {
int NumCpus() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }
}  // namespace

namespace {

// Runs a server command on core 0 and a client on the last core, retrying a
// refused connect while the server comes up; returns the client's output.
std::string RunPair(const std::vector<std::string>& server_argv,
                    const std::vector<std::string>& server_env, const std::string& client_cmd,
                    bool pin, int* rc) {
  int server = SpawnProcess(server_argv, server_env, pin ? 0 : -1, /*quiet=*/true);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string text;
  for (int attempt = 0; attempt < 10; ++attempt) {
    text.clear();
    FILE* p = popen(client_cmd.c_str(), "r");
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) text.append(buf.data(), n);
    *rc = pclose(p);
    if (*rc == 0 || (text.find("refused") == std::string::npos &&
                     text.find("Couldn't connect") == std::string::npos)) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  return text;
}

Perftest RunUcxPerftest(const std::string& tls, const std::string& test, uint64_t size, int iters,
                        int warmup, bool pin) {
  // perftest runs with the UCX settings Tessera gives itself (it inherits
  // this process's environment).
  transport::ApplyBackendDefaults("ucx");
  Perftest out;
  const int last = NumCpus() - 1;
  uint16_t port = FreePort("127.0.0.1");
  std::string cmd = fmt::format(
      "UCX_TLS={} timeout 120 {} ucx_perftest 127.0.0.1 -p {} -t {} -s {} -n {} -w {} -f "
      "2>/dev/null",
      tls, pin ? fmt::format("taskset -c {}", last) : "", port, test, size, iters, warmup);
  int rc = 0;
  std::string text =
      RunPair({"ucx_perftest", "-p", std::to_string(port)}, {"UCX_TLS=" + tls}, cmd, pin, &rc);
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

// perftest's ib_* tools over rdma_cm (-R), server on core 0, client on the
// last core, connecting to the address the bench uses.
Perftest RunIbPerftestOnce(const std::string& host, const std::string& test, uint64_t size,
                           int iters, bool pin) {
  Perftest out;
  const int last = NumCpus() - 1;
  const std::string port = std::to_string(FreePort(host));
  const std::string common = fmt::format("-R -F -s {} -n {} -p {}", size, std::max(iters, 5), port);
  std::vector<std::string> server = {
      test, "-R", "-F", "-s", std::to_string(size), "-n", std::to_string(std::max(iters, 5)),
      "-p", port};
  std::string cmd = fmt::format("timeout 120 {} {} {} {} 2>&1",
                                pin ? fmt::format("taskset -c {}", last) : "", test, common, host);
  int rc = 0;
  std::string text = RunPair(server, {}, cmd, pin, &rc);
  // The result line starts with the size: "#bytes #iterations ..." then
  // BW peak, BW average [MB/s, 2^20] for *_bw, or t_min t_max t_typical
  // [usec, one way] for *_lat.
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    double bytes = 0, n = 0, a = 0, b = 0, c = 0;
    if (!(in >> bytes >> n >> a >> b) || bytes != static_cast<double>(size)) continue;
    if (test.find("_lat") != std::string::npos) {
      if (!(in >> c)) continue;
      out.us = c;  // typical
    } else if (in >> c && c > 0) {
      // The message rate (Mpps, six decimals): the bandwidth column has
      // two, and reads "0.00" MB/s for small messages under emulation.
      out.us = 1.0 / c;
      out.gbps = static_cast<double>(size) * c / 1e3;
    } else {
      out.gbps = b * 1048576.0 / 1e9;  // average
      out.us = out.gbps > 0 ? static_cast<double>(size) / (out.gbps * 1e3) : 0;
    }
    out.ok = rc == 0 && out.us > 0;
  }
  if (!out.ok) {
    out.error = test + " failed (exit " + std::to_string(rc) +
                "): " + text.substr(text.size() > 300 ? text.size() - 300 : 0);
  }
  return out;
}

// On a loaded machine (Soft-RoCE under qemu's emulation, seen under ASan) a
// latency test now and then prints "inf" for every figure: its cycle counter
// saw no time pass. Such a run, or one that gave no time at all, is
// repeated, up to three runs in all.
Perftest RunIbPerftest(const std::string& host, const std::string& test, uint64_t size, int iters,
                       bool pin) {
  Perftest out;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    out = RunIbPerftestOnce(host, test, size, iters, pin);
    if (out.ok) break;
    if (attempt < 3) TLOG_WARN("{} gave no figure (run {} of 3): {}", test, attempt, out.error);
  }
  return out;
}

}  // namespace

namespace {
SocketOp SocketOpFor(Baseline kind) {
  switch (kind) {
    case Baseline::kPut:
      return SocketOp::kPush;
    case Baseline::kGet:
      return SocketOp::kPull;
    case Baseline::kMessageLatency:
      return SocketOp::kEcho;
  }
  return SocketOp::kEcho;
}
}  // namespace

std::string BaselineName(const Fabric& f, Baseline kind) {
  if (f.backend == "tcp") return SocketOpName(SocketOpFor(kind));
  const bool verbs = f.backend == "verbs";
  switch (kind) {
    case Baseline::kPut:
      return verbs ? "ib_write_bw" : "ucp_put_bw";
    case Baseline::kGet:
      return verbs ? "ib_read_bw" : "ucp_get";
    case Baseline::kMessageLatency:
      return verbs ? "ib_send_lat" : "ucp_am_lat";
  }
  return "";
}

Perftest RunBaseline(const Fabric& f, Baseline kind, uint64_t size, int iters, int warmup,
                     bool pin) {
  const std::string test = BaselineName(f, kind);
  if (f.backend == "tcp") return RunSocketBaseline(SocketOpFor(kind), size, iters, warmup, pin);
  if (f.backend == "verbs") return RunIbPerftest(f.host, test, size, iters, pin);
  return RunUcxPerftest(f.ucx_tls, test, size, iters, warmup, pin);
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::Start(const BenchOptions& o,
                                                          const Fabric& fabric, int shards,
                                                          int workers) {
  if (!o.cluster_file.empty()) return Attach(o, fabric, workers);
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  std::vector<TaskAddress> ps, ws;
  const std::vector<uint16_t> ports =
      PickListenPorts(fabric.host, static_cast<size_t>(shards) + static_cast<size_t>(workers));
  for (int i = 0; i < shards; ++i) ps.push_back({fabric.host, ports[i]});
  for (int i = 0; i < workers; ++i) ws.push_back({fabric.host, ports[shards + i]});
  ClusterSpec spec;
  TESSERA_RETURN_IF_ERROR(spec.AddJob("ps", ps));
  TESSERA_RETURN_IF_ERROR(spec.AddJob("worker", ws));
  auto hosts = [](const std::vector<TaskAddress>& v) {
    std::string s;
    for (const auto& a : v) s += (s.empty() ? "" : ",") + a.ToString();
    return s;
  };
  TESSERA_ASSIGN_OR_RETURN(const std::string secret, GenerateSecret());
  const int cpus = NumCpus();
  for (int i = 0; i < shards; ++i) {
    std::vector<std::string> argv = {
        SelfExecutable(), "server",          "--ps_hosts",    hosts(ps),
        "--worker_hosts", hosts(ws),         "--job",         "ps",
        "--task",         std::to_string(i), "--staging-mib", std::to_string(o.staging_mib),
        "--transport",    fabric.backend};
    if (o.busy_poll) argv.push_back("--busy-poll");
    argv.insert(argv.end(), {"--session-protection", fabric.protection});
    if (o.memory == "cuda") argv.insert(argv.end(), {"--memory", "cuda", "--allow-host-staging"});
    // Shards on the first cores, the bench (workers) on the last one.
    const int cpu = o.pin ? (cpus > 1 ? i % (cpus - 1) : 0) : -1;
    c->shards_.push_back(SpawnProcess(
        argv, {"TESSERA_SECRET=" + secret, "TESSERA_LOG_LEVEL=warn", "UCX_TLS=" + fabric.ucx_tls},
        cpu));
  }
  TESSERA_RETURN_IF_ERROR(c->ConnectWorkers(o, spec, secret, fabric, workers));
  c->shard_addresses_ = ps;
  c->secret_ = secret;
  c->backend_ = fabric.backend;
  return c;
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::Attach(const BenchOptions& o,
                                                           const Fabric& fabric, int workers) {
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
  TESSERA_RETURN_IF_ERROR(c->ConnectWorkers(o, *spec, *secret, fabric, workers));
  return c;
}

Status LocalCluster::ConnectWorkers(const BenchOptions& o, const ClusterSpec& spec,
                                    const std::string& secret, const Fabric& fabric, int workers) {
  for (int w = 0; w < workers; ++w) {
    ClientOptions copts;
    copts.cluster = spec;
    copts.task = {"worker", w};
    copts.secret = secret;
    copts.startup_timeout = std::chrono::seconds(30);
    copts.busy_poll = o.busy_poll;
    copts.transport = fabric.backend;
    copts.session_protection = ParseSessionProtection(fabric.protection).value();
    copts.allow_host_staging = o.memory == "cuda";  // counted, and shown per row
    auto client = Client::Connect(copts);
    if (!client.ok()) return client.status();
    clients_.push_back(std::move(*client));
  }
  return Status::Ok();
}

LocalCluster::~LocalCluster() {
  observers_.clear();
  clients_.clear();
  for (pid_t pid : shards_) kill(pid, SIGTERM);
  for (pid_t pid : shards_) waitpid(pid, nullptr, 0);
}

}  // namespace tessera::tools::bench
