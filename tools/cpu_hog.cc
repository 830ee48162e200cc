#include "tools/cpu_hog.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <thread>

namespace tessera::tools {

CpuHog::CpuHog(int processes) {
  const int n = processes > 0 ? processes
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < n; ++i) {
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // Gone with the parent, however it ends; and not left behind if the
      // parent died before the line above took effect.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(0);
      volatile uint64_t spin = 0;
      for (;;) spin = spin + 1;
    }
    if (pid > 0) pids_.push_back(pid);
  }
}

CpuHog::~CpuHog() {
  for (pid_t pid : pids_) kill(pid, SIGKILL);
  for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
}

}  // namespace tessera::tools
