#include "core/node_id.h"

#include <fstream>

namespace tessera {

const std::string& NodeId() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  return id;
}

}  // namespace tessera
