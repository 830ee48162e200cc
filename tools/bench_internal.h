// Pieces the bench scenarios share: timing summaries, result rows, the
// ucx_perftest runner and a local cluster of shard processes.
#pragma once

#include <sys/types.h>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/client.h"
#include "tools/bench.h"
#include "tools/observer.h"

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
  // The shards' processes, all of them, per call (-1: not counted).
  double shard_allocs_per_op = -1;
  std::string baseline;  // "ucp_put_bw", "2 x ucp_am_lat", "bound", ...
  double baseline_us = 0, baseline_gbps = 0;
  // The baseline's own p99, where it has one (Perftest::p99_us): Tessera's
  // tail beside the fabric's in the same run.
  double baseline_p99_us = 0;
  // Tessera over the baseline: bandwidths for large sizes, round-trip times
  // for small ones (see `ratio_of`).
  double ratio = 0;
  std::string ratio_of;  // "GB/s" or "time"
  std::string note;
  // --load: "quiet", or "hog" for the figures measured beside the CPU hog,
  // whose p50 is compared with the quiet row's (`vs_quiet`).
  std::string load;
  double vs_quiet = 0;
  // --memory cuda: how the bytes went ("CUDA IPC", "fabric", "host-staged",
  // "inline") and the bytes staged through host memory per call.
  std::string gpu_path;
  double host_staged_bytes_per_op = 0;
  nlohmann::json ToJson() const;
};

// Which fabric a scenario runs on, from a --transport value: "tcp"
// (Tessera's own sockets), "ucx-tcp" (UCX over tcp), "shm"
// (posix,sysv,cma,tcp) or another UCX_TLS value on the ucx backend, or
// "verbs" (Tessera's own backend, on the address --host names).
struct Fabric {
  std::string name;
  std::string backend;  // tcp | ucx | verbs
  std::string ucx_tls;  // ucx only
  std::string host;     // where shards and peers listen
  // tcp-protected: every session authenticated and encrypted ("on");
  // tcp-integrity: authenticated only ("integrity"); else "auto".
  std::string protection = "auto";
};
Fabric FabricFor(const BenchOptions& o, const std::string& transport);

struct Perftest {
  bool ok = false;
  double us = 0;    // per operation: one-way latency for *_lat tests
  double gbps = 0;  // bandwidth tests
  // `us` is a whole round trip (the socket baseline), not one way.
  bool round_trip = false;
  // The 99th percentile of `us`, where the baseline times each operation
  // itself (the socket baseline); 0 where it reports only a mean.
  double p99_us = 0;
  std::string error;
};
// Sets a row's baseline from a perftest run: a bandwidth test (ratio of
// GB/s), or a latency test as a round trip (2x its one-way time; ratio of
// times).
void CompareBandwidth(Row* row, const std::string& test, const Perftest& p);
void CompareRoundTrip(Row* row, const std::string& test, const Perftest& lat);

// The raw fabric's own figure for the same size, in the same run: a put
// bandwidth, a get bandwidth, or a message round trip's one-way latency.
// UCX: ucx_perftest (ucp_put_bw, ucp_get, ucp_am_lat) with the same UCX_TLS;
// verbs: perftest (ib_write_bw, ib_read_bw, ib_send_lat) over rdma_cm;
// Tessera's own tcp: plain sockets on loopback (socket push, pull, echo).
enum class Baseline { kPut, kGet, kMessageLatency };
std::string BaselineName(const Fabric& f, Baseline kind);
Perftest RunBaseline(const Fabric& f, Baseline kind, uint64_t size, int iters, int warmup,
                     bool pin);

// Plain sockets on loopback, a server thread that only moves the bytes:
// push sends N bytes and reads an 8-byte answer, pull sends 8 bytes and
// reads N, echo sends and reads N. Medians of round trips (tools/bench_socket.cc).
enum class SocketOp : uint64_t { kPush = 0, kPull = 1, kEcho = 2 };
std::string SocketOpName(SocketOp op);
Perftest RunSocketBaseline(SocketOp op, uint64_t size, int iters, int warmup, bool pin);

// Shard processes (`tessera server`) and worker clients in this process.
// The cluster a scenario runs on: shard processes it starts on loopback, or
// the running cluster of --cluster; and one client per worker.
class LocalCluster {
 public:
  static Result<std::unique_ptr<LocalCluster>> Start(const BenchOptions& o, const Fabric& fabric,
                                                     int shards, int workers);
  ~LocalCluster();
  Client& worker(int i) { return *clients_[static_cast<size_t>(i)]; }
  int num_workers() const { return static_cast<int>(clients_.size()); }

  // The shards' own heap allocations (their status says them: the `tessera`
  // process counts, core/heap_counter.h): Mark before the calls, then
  // ShardAllocationsPerCall after them, what asking costs taken off. Nothing
  // for a cluster the bench did not start, or when a shard cannot say.
  void MarkShardAllocations();
  std::optional<double> ShardAllocationsPerCall(uint64_t calls);

 private:
  LocalCluster() = default;
  static Result<std::unique_ptr<LocalCluster>> Attach(const BenchOptions& o, const Fabric& fabric,
                                                      int workers);
  Status ConnectWorkers(const BenchOptions& o, const ClusterSpec& spec, const std::string& secret,
                        const Fabric& fabric, int workers);
  // The sum of the shards' counts now, less nothing; opens the observers
  // and measures what one status question costs the first time.
  std::optional<uint64_t> ShardAllocationsNow();

  std::vector<pid_t> shards_;  // empty for a given cluster
  std::vector<std::unique_ptr<Client>> clients_;
  // For counting the shards' allocations.
  std::vector<TaskAddress> shard_addresses_;
  std::string secret_, backend_;
  std::vector<std::unique_ptr<Observer>> observers_;
  uint64_t cost_of_asking_ = 0;  // allocations per status question, all shards
  std::optional<uint64_t> marked_;
};

// The scenarios; each appends its rows.
// --load: each loaded row after its quiet one, with its p50 over the quiet
// p50, and a note where a loaded p50 looks bound to a clock tick.
Status PairWithQuiet(const std::vector<Row>& quiet, const std::vector<Row>& loaded,
                     std::vector<Row>* rows);
Status RunFabric(const BenchOptions& o, const Fabric& fabric, std::vector<Row>* rows);
Status RunOps(const BenchOptions& o, const Fabric& fabric, std::vector<Row>* rows);
Status RunStep(const BenchOptions& o, const Fabric& fabric, std::vector<Row>* rows);

// Tessera's own transport moving `bytes` on this transport, for the step's
// bound (GB/s): streamed puts, and one put the peer then reads and answers
// (`fabric-put-read`, the least a push costs, since the shard reads what it
// applies).
struct FabricBandwidth {
  double put_gbps = 0;
  double put_read_gbps = 0;
};
Result<FabricBandwidth> MeasureFabricBandwidth(const BenchOptions& o, const Fabric& fabric,
                                               uint64_t bytes);

std::string SizeName(uint64_t bytes);

// A worker thread's arrival at the barrier where the timed calls start (and
// the allocation counts with them): once, at its first timed call, or on
// its way out of an early return, so that no other worker waits for it.
template <typename Barrier>
class ArriveOnce {
 public:
  explicit ArriveOnce(Barrier& barrier) : barrier_(barrier) {}
  ArriveOnce(const ArriveOnce&) = delete;
  ArriveOnce& operator=(const ArriveOnce&) = delete;
  void Now() {
    if (!std::exchange(arrived_, true)) barrier_.arrive_and_wait();
  }
  ~ArriveOnce() {
    if (!arrived_) barrier_.arrive_and_drop();
  }

 private:
  Barrier& barrier_;
  bool arrived_ = false;
};

}  // namespace tessera::tools::bench
