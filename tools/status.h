// `tessera status`: asks every ps task (and a separate coordinator) what it
// holds and has done: where its parameters live (host or GPU, staged through
// host memory or not), which workers it serves and whether over CUDA IPC,
// and its counters (pushes, pulls, staged bytes, the global step).
#pragma once

#include "tools/cluster_flags.h"

namespace tessera::tools {

struct StatusOptions {
  ClusterFlags cluster;
  bool json = false;
  int timeout_ms = 5000;  // per task
};

// 0 when every task answered, 1 otherwise (the unreachable ones are named).
int RunStatus(const StatusOptions& options);

}  // namespace tessera::tools
