// `tessera bench`: push and pull round-trip time and bandwidth through a real
// shard process, beside ucx_perftest's put/get on the same transport and
// sizes, measured in the same run. (The full scenario set comes with the
// benchmarks issue.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::tools {

struct BenchOptions {
  std::vector<std::string> tls = {"tcp", "posix,sysv,cma,tcp"};  // UCX_TLS values to sweep
  std::vector<uint64_t> sizes = {4096, 1u << 20, 64u << 20};
  int iters = 30;
  int warmup = 3;
  bool baseline = false;  // run ucx_perftest beside
  bool pin = true;        // shard on core 0, worker on core 1
  std::string json_path;
};

int RunBench(const BenchOptions& options);

}  // namespace tessera::tools
