// What the fabrics on this host are and can do, as `tessera doctor` reports
// it: the RDMA devices and their ports, the UCX library that was loaded, and
// the congestion control of Tessera's tcp sockets.
// Tools ask here, never the backends' headers or libraries.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tessera::transport {

struct ProbeFinding {
  std::string check;
  std::string level;  // ok, info, warn, problem
  std::string detail;
  std::string fix;
  nlohmann::json data = nlohmann::json::object();
};

// The RDMA devices, their ports' state, link layer, MTU and GIDs, and
// whether rdma_cm can set up connections. "info" in a build without verbs.
ProbeFinding ProbeRdmaDevices();

// Which UCX is loaded, whether it maps CUDA memory, and the transports it sees.
ProbeFinding ProbeUcx();

// The congestion control Tessera's tcp sockets get (TESSERA_TCP_CONGESTION,
// else the host's default): "problem" where the kernel refuses the one asked
// for, "warn" for the host's bbr, which is slow across veth pairs.
ProbeFinding ProbeTcpCongestion();

// Which session protection this environment gives Tessera's tcp
// (TESSERA_SESSION_PROTECTION, else auto) and how fast this host seals:
// "problem" for a setting that is none of auto, on, off; "warn" for off.
ProbeFinding ProbeSessionProtection();

// "mlx5_0:1" for the RDMA device and port that carry network interface
// `netdev` (from sysfs), or "" when none does.
std::string RdmaDeviceOn(const std::string& netdev);

}  // namespace tessera::transport
