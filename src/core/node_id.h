// Which machine this is, for deciding that two processes share a node (and
// so may map each other's GPU memory with CUDA IPC).
#pragma once

#include <string>

namespace tessera {

// The running kernel's boot id (/proc/sys/kernel/random/boot_id): the same
// for every process of one booted node, containers included, and different
// on every other node and after every reboot. Empty where it cannot be read.
const std::string& NodeId();

}  // namespace tessera
