// `tessera bench`: Tessera's figures beside the raw fabric's, measured in the
// same run. Scenarios:
//   fabric     put, get and message round trips through Tessera's own
//              transport interface, against a peer process
//   push, pull, push_pull
//              client calls through real shard processes, over sizes and
//              batch sizes (tensors per call), shard and worker counts
//   step       a synchronous training step of a real model's tensors
//              (bench/models/*.txt) against its bandwidth bound
// With --baseline each figure is printed beside the raw fabric's for the
// same transport and size, and their ratio: ucx_perftest's (ucp_put_bw,
// ucp_get, ucp_am_lat) on UCX, perftest's (ib_write_bw, ib_read_bw,
// ib_send_lat) on verbs, plain sockets' (push, pull, echo) on Tessera's tcp.
// With --load everything is measured again beside a CPU hog on every core,
// each loaded row next to its quiet one, with the loaded/quiet ratio.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::tools {

struct BenchOptions {
  std::vector<std::string> scenarios;  // empty: push and pull
  // tcp (Tessera's sockets), ucx-tcp, shm, verbs, or a UCX_TLS value
  std::vector<std::string> transports = {"tcp", "shm"};
  std::vector<uint64_t> sizes = {8, 4096, 1u << 20, 64u << 20};  // bytes per tensor
  std::vector<int> batches = {1};                                // tensors per call
  int shards = 1;
  int workers = 1;
  int iters = 30;
  int warmup = 3;
  // Busy work between two calls, in µs: a trainer computes between its
  // calls, and a call made after a pause may find the fabric's and the
  // shard's threads asleep, which a back-to-back loop never does.
  int gap_us = 0;
  // host, or cuda: the shards keep parameters on GPU 0 (staging through
  // host memory where the fabric cannot reach it) and the workers push from
  // and pull into GPU buffers; --baseline then compares with cudaMemcpy.
  std::string memory = "host";
  std::string model = "resnet50";  // step: bench/models/<model>.txt, or a path
  int staging_mib = 160;           // each worker's staging slot on each shard it starts
  bool baseline = false;           // run ucx_perftest beside
  bool check = false;              // verify every transferred byte
  bool pin = true;                 // shards on the first cores, the bench on the last
  bool busy_poll = false;
  // Each figure measured twice: quiet, then beside a CPU hog on every core
  // (tools/cpu_hog.h), as on a training host whose cores are never idle.
  bool load = false;
  // Where the shards and the fabric peer listen: loopback for UCX's tcp and
  // shared memory; an address an RDMA device carries for verbs.
  std::string host = "127.0.0.1";
  // A running cluster to measure (JSON spec, as `tessera server --cluster`),
  // instead of shard processes started on loopback; the bench's workers are
  // its worker tasks 0..workers-1.
  std::string cluster_file;
  std::string secret_file;  // else TESSERA_SECRET / TESSERA_SECRET_FILE
  // The fabric peer (the fabric scenario, the step's bound) in this named
  // network namespace (`ip netns exec`), listening on fabric_peer_host:
  // with --cluster across namespaces, the bound then crosses them too.
  std::string fabric_peer_netns;
  std::string fabric_peer_host;  // empty: --host
  std::string json_path;
  std::string plot_path;
};

int RunBench(const BenchOptions& options);

// The hidden `tessera bench-peer` a fabric run talks to.
struct BenchPeerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t region_bytes = 1u << 20;
  std::string backend = "tcp";  // the bench always names it
  bool busy_poll = false;
};
int RunBenchPeer(const BenchPeerOptions& options);

// Heap allocations made by this process so far (tools/alloc_counter.cc).
uint64_t HeapAllocations();

}  // namespace tessera::tools
