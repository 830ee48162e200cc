// A CPU hog on every core, standing in for what keeps a training host busy
// (data loaders, compute threads): one child process per core that spins
// until the hog goes away or its parent dies. `tessera bench --load`
// measures beside it; the tests use it to guard against latency cliffs.
// It loads the cores like `stress-ng --cpu N` does.
#pragma once

#include <sys/types.h>

#include <vector>

namespace tessera::tools {

class CpuHog {
 public:
  // `processes` <= 0: one per online core.
  explicit CpuHog(int processes = 0);
  ~CpuHog();
  CpuHog(const CpuHog&) = delete;
  CpuHog& operator=(const CpuHog&) = delete;
  int processes() const { return static_cast<int>(pids_.size()); }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace tessera::tools
