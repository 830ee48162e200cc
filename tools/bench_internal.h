// Pieces the bench scenarios share: timing summaries, result rows, the
// ucx_perftest runner and a local cluster of shard processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/client.h"
#include "tools/bench.h"

namespace tessera::tools::bench {

struct Stats {
  double p50_us = 0, p99_us = 0;
  double gbps = 0;  // 1e9 bytes/s, from the median
};
Stats Summarise(std::vector<double> us, uint64_t bytes);

// One measured figure beside its raw-fabric twin.
struct Row {
  std::string scenario;  // fabric-put, push, pull, step, ...
  std::string transport;
  uint64_t bytes = 0;  // per tensor (or per operation)
  int batch = 1, shards = 0, workers = 0;
  Stats tessera;
  double allocs_per_op = -1;  // -1: not counted
  std::string baseline;       // "ucp_put_bw", "2 x ucp_am_lat", "bound", ...
  double baseline_us = 0, baseline_gbps = 0;
  // Tessera over the baseline: bandwidths for large sizes, round-trip times
  // for small ones (see `ratio_of`).
  double ratio = 0;
  std::string ratio_of;  // "GB/s" or "time"
  std::string note;
  nlohmann::json ToJson() const;
};

// "tcp" -> "tcp", "shm" -> "posix,sysv,cma,tcp"; anything else is a UCX_TLS value.
std::string UcxTls(const std::string& transport);

struct Perftest {
  bool ok = false;
  double us = 0;    // per operation: one-way latency for *_lat tests
  double gbps = 0;  // bandwidth tests
  std::string error;
};
// Sets a row's baseline from a perftest run: a bandwidth test (ratio of
// GB/s), or ucp_am_lat as a round trip (2x its one-way time; ratio of times).
void CompareBandwidth(Row* row, const std::string& test, const Perftest& p);
void CompareRoundTrip(Row* row, const Perftest& am_lat);

// ucx_perftest's server and client on the bench's cores, same UCX_TLS.
Perftest RunPerftest(const std::string& tls, const std::string& test, uint64_t size, int iters,
                     int warmup, bool pin);

// Shard processes (`tessera server`) and worker clients in this process.
// The cluster a scenario runs on: shard processes it starts on loopback, or
// the running cluster of --cluster; and one client per worker.
class LocalCluster {
 public:
  static Result<std::unique_ptr<LocalCluster>> Start(const BenchOptions& o, const std::string& tls,
                                                     int shards, int workers);
  ~LocalCluster();
  Client& worker(int i) { return *clients_[static_cast<size_t>(i)]; }
  int num_workers() const { return static_cast<int>(clients_.size()); }

 private:
  LocalCluster() = default;
  static Result<std::unique_ptr<LocalCluster>> Attach(const BenchOptions& o, int workers);
  Status ConnectWorkers(const BenchOptions& o, const ClusterSpec& spec, const std::string& secret,
                        int workers);
  std::vector<pid_t> shards_;  // empty for a given cluster
  std::vector<std::unique_ptr<Client>> clients_;
};

// The scenarios; each appends its rows.
Status RunFabric(const BenchOptions& o, const std::string& transport, std::vector<Row>* rows);
Status RunOps(const BenchOptions& o, const std::string& transport, std::vector<Row>* rows);
Status RunStep(const BenchOptions& o, const std::string& transport, std::vector<Row>* rows);

// Tessera's own transport put bandwidth for `bytes` on this transport, for
// the step's bound (GB/s).
Result<double> FabricPutGbps(const BenchOptions& o, const std::string& tls, uint64_t bytes);

std::string SizeName(uint64_t bytes);

}  // namespace tessera::tools::bench
