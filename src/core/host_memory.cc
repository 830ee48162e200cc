#include "core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace tessera {
namespace {

uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// cgroup v2: the limit of this process's group less what it uses; none
// when there is no limit ("max") or no cgroup v2.
uint64_t CgroupHeadroom() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return std::numeric_limits<uint64_t>::max();
  const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
  std::ifstream max_file(dir + "/memory.max"), current_file(dir + "/memory.current");
  std::string max;
  uint64_t current = 0;
  if (!(max_file >> max) || max == "max" || !(current_file >> current)) {
    return std::numeric_limits<uint64_t>::max();
  }
  uint64_t limit = 0;
  std::istringstream(max) >> limit;
  return limit > current ? limit - current : 0;
}

}  // namespace

uint64_t AvailableHostMemory() {
  const uint64_t headroom = CgroupHeadroom();
  const uint64_t available = MemAvailable();
  if (available == 0) return headroom == std::numeric_limits<uint64_t>::max() ? 0 : headroom;
  return std::min(available, headroom);
}

}  // namespace tessera
