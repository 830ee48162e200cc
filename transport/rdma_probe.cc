#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessera_config.h"
#include "transport/probe.h"

#if TESSERA_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

namespace tessera::transport {
namespace {

namespace fs = std::filesystem;
using Finding = ProbeFinding;

std::string ReadLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string RdmaDeviceOn(const std::string& netdev) {
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", ec)) {
      for (const auto& nd : fs::directory_iterator(port.path() / "gid_attrs" / "ndevs", ec)) {
        if (ReadLine(nd.path()) == netdev) {
          return dev.path().filename().string() + ":" + port.path().filename().string();
        }
      }
    }
  }
  return "";
}

Finding ProbeRdmaDevices() {
  Finding f{"rdma-devices", "ok", "", ""};
#if TESSERA_HAVE_VERBS
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr || num == 0) {
    if (list) ibv_free_device_list(list);
    f.level = "problem";
    f.detail =
        "no RDMA devices: the verbs backend cannot run here (UCX's tcp and shared memory can)";
    f.fix =
        "load your adapter's driver (e.g. mlx5_ib) and check `ibv_devices`; for tests, "
        "Soft-RoCE: `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE`; "
        "or use --transport ucx";
    return f;
  }
  std::vector<std::string> down, lines;
  for (int i = 0; i < num; ++i) {
    const std::string name = ibv_get_device_name(list[i]);
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      down.push_back(name + " (cannot be opened: " + std::strerror(errno) + ")");
      continue;
    }
    ibv_device_attr attr{};
    ibv_query_device(ctx, &attr);
    nlohmann::json dev = {{"name", name}, {"ports", nlohmann::json::array()}};
    for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr port{};
      if (ibv_query_port(ctx, p, &port) != 0) continue;
      const bool eth = port.link_layer == IBV_LINK_LAYER_ETHERNET;
      const std::string state = ibv_port_state_str(port.state);
      // The GID table, and the RoCE v2 IPv4 entry rdma_cm picks for an IPv4 route.
      nlohmann::json gids = nlohmann::json::array();
      int roce_v2_ipv4 = -1;
      const fs::path base = fs::path("/sys/class/infiniband") / name / "ports" / std::to_string(p);
      for (int g = 0; g < port.gid_tbl_len && g < 16; ++g) {
        const std::string gid = ReadLine(base / "gids" / std::to_string(g));
        if (gid.empty() || gid == "0000:0000:0000:0000:0000:0000:0000:0000") continue;
        const std::string type = ReadLine(base / "gid_attrs" / "types" / std::to_string(g));
        const std::string ndev = ReadLine(base / "gid_attrs" / "ndevs" / std::to_string(g));
        gids.push_back({{"index", g}, {"gid", gid}, {"type", type}, {"netdev", ndev}});
        if (roce_v2_ipv4 < 0 && type.find("v2") != std::string::npos &&
            gid.rfind("0000:0000:0000:0000:0000:ffff:", 0) == 0) {
          roce_v2_ipv4 = g;
        }
      }
      dev["ports"].push_back({{"port", p},
                              {"state", state},
                              {"link_layer", eth ? "Ethernet (RoCE)" : "InfiniBand"},
                              {"active_mtu", 128 << port.active_mtu},
                              {"gids", gids},
                              {"roce_v2_ipv4_gid_index", roce_v2_ipv4}});
      std::string line = name + " port " + std::to_string(p) + ": " + state + ", " +
                         (eth ? "RoCE" : "InfiniBand") + ", MTU " +
                         std::to_string(128 << port.active_mtu);
      if (eth) {
        line += roce_v2_ipv4 >= 0 ? ", RoCE v2 IPv4 GID index " + std::to_string(roce_v2_ipv4) +
                                        " (rdma_cm picks the GID of each route itself)"
                                  : ", no RoCE v2 IPv4 GID (is an IPv4 address on its netdev?)";
      }
      lines.push_back(line);
      if (port.state != IBV_PORT_ACTIVE) down.push_back(name + " port " + std::to_string(p));
    }
    f.data["devices"].push_back(dev);
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  for (const auto& l : lines) f.detail += (f.detail.empty() ? "" : "; ") + l;
  if (!down.empty()) {
    f.level = "problem";
    std::string which;
    for (const auto& d : down) which += (which.empty() ? "" : ", ") + d;
    f.detail += ". Not active: " + which;
    f.fix =
        "InfiniBand: check the cable and that a subnet manager runs (`ibstat`, opensm); "
        "RoCE: bring the network interface up (`ip link set IFACE up`)";
  }
  if (!fs::exists("/dev/infiniband/rdma_cm")) {
    f.level = "problem";
    f.detail += ". /dev/infiniband/rdma_cm is missing: connections cannot be set up";
    f.fix = "modprobe rdma_ucm";
  }
#else
  f.level = "info";
  f.detail =
      "this build has no verbs backend (built without libibverbs-dev/librdmacm-dev or "
      "with -Dverbs=disabled)";
  f.fix = "install libibverbs-dev and librdmacm-dev and rebuild for --transport verbs";
#endif
  return f;
}

}  // namespace tessera::transport
