#include "tools/doctor.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpu/cuda.h"
#include "tessera/cluster.h"
#include "tessera_config.h"
#include "transport/sockaddr.h"
#include "transport/ucx/ucx_context.h"

#if TESSERA_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

namespace tessera::tools {
namespace {

namespace fs = std::filesystem;

struct Finding {
  std::string check;
  std::string level;  // ok, info, warn, problem
  std::string detail;
  std::string fix;
  nlohmann::json data = nlohmann::json::object();
};

std::string ReadLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string Mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

// The RDMA device (and port) whose GID table names this network interface.
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

// --- RDMA devices, ports and GIDs -------------------------------------------

Finding CheckDevices() {
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

// --- Locked memory ----------------------------------------------------------

bool HasIpcLock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
      return caps & (1ull << 14);  // CAP_IPC_LOCK
    }
  }
  return false;
}

Finding CheckMemlock(const DoctorOptions& o) {
  Finding f{"locked-memory", "ok", "", ""};
  rlimit limit{};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  const double mib = 1024.0 * 1024.0;
  // Parameters and optimizer state, one staging slot per worker, and about
  // 0.6 MiB of message buffers per connection.
  const double need = o.params_mib * mib + o.workers * (o.staging_mib * mib + 0.6 * mib);
  const bool unlimited = limit.rlim_cur == RLIM_INFINITY;
  const bool cap = HasIpcLock();
  f.data = {{"limit_bytes", unlimited ? -1.0 : static_cast<double>(limit.rlim_cur)},
            {"cap_ipc_lock", cap},
            {"needed_bytes", need}};
  const std::string have = unlimited ? "unlimited" : Mib(static_cast<double>(limit.rlim_cur));
  f.detail = "limit " + have + (cap ? " (CAP_IPC_LOCK: not enforced)" : "") + "; a shard with " +
             Mib(o.params_mib * mib) + " of parameters and " + std::to_string(o.workers) +
             " workers (" + Mib(o.staging_mib * mib) + " staging each) registers about " +
             Mib(need);
  if (!unlimited && !cap && static_cast<double>(limit.rlim_cur) < need) {
    f.level = "problem";
    f.fix =
        "raise the locked-memory limit: `ulimit -l unlimited` (and memlock in "
        "/etc/security/limits.conf), LimitMEMLOCK=infinity under systemd, "
        "--ulimit memlock=-1 with docker; or run with CAP_IPC_LOCK";
  }
  return f;
}

// --- UCX --------------------------------------------------------------------

Finding CheckUcx() {
  Finding f{"ucx", "ok", "", ""};
  ucp_config_t* config = nullptr;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_context_h ctx = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK ||
      ucp_init(&params, config, &ctx) != UCS_OK) {
    if (config) ucp_config_release(config);
    f.level = "problem";
    f.detail = "UCX " + std::string(ucp_get_version_string()) + " failed to initialise";
    f.fix = "check UCX_* variables (ucx_info -c) and that libucx is installed";
    return f;
  }
  ucp_config_release(config);
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  ucp_context_query(ctx, &attr);
  const bool cuda = attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA);
  // The transports it sees: "resource N : md M dev D flags -- tl/dev" lines.
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  ucp_context_print_info(ctx, out);
  fclose(out);
  std::istringstream lines(std::string(buf, len));
  free(buf);
  std::vector<std::string> tls;
  std::string line;
  while (std::getline(lines, line)) {
    const auto at = line.find("-- ");
    if (line.find("resource") != std::string::npos && at != std::string::npos) {
      tls.push_back(line.substr(at + 3));
    }
  }
  ucp_cleanup(ctx);
  std::string list;
  for (const auto& t : tls) list += (list.empty() ? "" : ", ") + t;
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  f.data = {{"version", ucp_get_version_string()},
            {"loaded", transport::DescribeUcxLibrary()},
            {"cuda", cuda},
            {"transports", tls}};
  f.detail = transport::DescribeUcxLibrary() + ", " +
             (cuda ? "built with CUDA" : "without CUDA support") + "; transports: " + list;
  if (!cuda) {
    // A UCX built with CUDA has its CUDA module beside it; without a driver
    // it still reports host memory only.
    const bool cuda_module = transport::UcxHasCudaModule();
    const fs::path modules = fs::path(transport::UcxLibraryPath()).parent_path() / "ucx";
    f.data["cuda_module"] = cuda_module;
    f.level = "info";
    f.fix = cuda_module
                ? "this UCX has CUDA modules (" + modules.string() +
                      "), but no CUDA driver answered: GPU memory needs the NVIDIA driver"
                : "for GPU-resident parameters over UCX, use a CUDA-enabled UCX (e.g. the "
                  "libucx-cu12 wheel, meson -Ducx_prefix; docs/gpu.md); host memory works as is";
  }
  if (major == 1 && minor < 15 && fs::exists("/sys/class/infiniband")) {
    f.level = "warn";
    f.detail +=
        ". UCX before 1.15 can miss RC wake-ups (openucx/ucx#8959): Tessera wakes its "
        "UCX progress thread every 1 ms while idle to bound the delay";
    f.fix = "a UCX of 1.15 or later removes the periodic wake-up";
  }
  return f;
}

// --- GPU memory registration -------------------------------------------------

Finding CheckGpu() {
  Finding f{"gpu-registration", "info", "", ""};
  const bool gpu = fs::exists("/proc/driver/nvidia/version");
  const bool peermem =
      fs::exists("/sys/module/nvidia_peermem") || fs::exists("/sys/module/nv_peer_mem");
  utsname u{};
  uname(&u);
  int kmaj = 0, kmin = 0;
  std::sscanf(u.release, "%d.%d", &kmaj, &kmin);
  const bool dmabuf_kernel = kmaj > 5 || (kmaj == 5 && kmin >= 12);
  const Status usable = gpu::Available();
  f.data = {{"nvidia_driver", gpu},
            {"built_with_cuda", gpu::Built()},
            {"cuda", usable.ok() ? "ok" : usable.message()},
            {"peer_memory_module", peermem},
            {"kernel", u.release},
            {"kernel_dmabuf", dmabuf_kernel}};
  if (!gpu) {
    f.detail =
        "no NVIDIA driver (/proc/driver/nvidia is absent): GPU memory registration does "
        "not apply here (" +
        (usable.ok() ? std::string("yet CUDA answers") : usable.message()) + ")";
    return f;
  }
  if (!usable.ok()) {
    f.level = "problem";
    f.detail = "NVIDIA driver present, but " + usable.message();
    f.fix = gpu::Built() ? "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
                         : "rebuild with CUDA (meson -Dcuda=enabled, nvcc on PATH)";
    return f;
  }
  auto device = gpu::DescribeDevice(0);
  f.detail =
      (device.ok() ? *device : device.status().message()) + "; dmabuf registration " +
      (dmabuf_kernel ? std::string("possible (kernel ") : std::string("impossible (kernel ")) +
      u.release + "); peer-memory module " + (peermem ? "loaded" : "not loaded");
  if (!dmabuf_kernel && !peermem) {
    f.level = "problem";
    f.fix =
        "load nvidia_peermem (modprobe nvidia_peermem) or use a kernel of 5.12 or later "
        "(dmabuf) for GPUDirect RDMA";
  }
  return f;
}

// --- Interfaces and addresses ------------------------------------------------

Finding CheckAddresses(const DoctorOptions& o) {
  Finding f{"addresses", "info", "", ""};
  std::vector<std::pair<std::string, std::string>> ifaces;  // name, IPv4
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      char host[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, host,
                sizeof(host));
      ifaces.emplace_back(i->ifa_name, host);
    }
    freeifaddrs(list);
  }
  auto describe = [&](const std::string& addr) -> std::string {
    for (const auto& [name, ip] : ifaces) {
      if (ip == addr) {
        const std::string rdma = RdmaDeviceOn(name);
        return name +
               (rdma.empty() ? " (no RDMA device: tcp only)" : " (RDMA device " + rdma + ")");
      }
    }
    return "";
  };
  for (const auto& [name, ip] : ifaces) {
    const std::string rdma = RdmaDeviceOn(name);
    f.data["interfaces"].push_back({{"name", name}, {"ipv4", ip}, {"rdma_device", rdma}});
    f.detail +=
        (f.detail.empty() ? "" : "; ") + name + " " + ip + (rdma.empty() ? "" : " -> " + rdma);
  }
  Result<ClusterSpec> spec = Status::NotFound("no cluster");
  if (!o.cluster_file.empty()) {
    spec = ClusterSpec::FromJsonFile(o.cluster_file);
  } else if (auto env = TfConfigFromEnv(); env.ok()) {
    spec = env->cluster;
  }
  if (!spec.ok()) {
    if (!o.cluster_file.empty()) {
      f.level = "problem";
      f.detail += ". --cluster: " + spec.status().ToString();
    }
    return f;
  }
  for (const std::string job : {"chief", "coordinator", "ps", "worker"}) {
    for (int i = 0; i < spec->num_tasks(job); ++i) {
      auto addr = spec->address({job, i});
      if (!addr.ok()) continue;
      const std::string where = describe(addr->host);
      if (where.empty()) continue;  // another host's task
      f.detail += ". /job:" + job + "/task:" + std::to_string(i) + " (" + addr->ToString() +
                  ") would use " + where;
      f.data["tasks"].push_back({{"task", "/job:" + job + "/task:" + std::to_string(i)},
                                 {"address", addr->ToString()},
                                 {"interface", where}});
    }
  }
  return f;
}

int RunDoctor(const DoctorOptions& o) {
  std::vector<Finding> findings = {CheckDevices(), CheckMemlock(o), CheckUcx(), CheckGpu(),
                                   CheckAddresses(o)};
  int problems = 0;
  for (const auto& f : findings) problems += f.level == "problem";
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& f : findings) {
      out.push_back({{"check", f.check},
                     {"level", f.level},
                     {"detail", f.detail},
                     {"fix", f.fix},
                     {"data", f.data}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    for (const auto& f : findings) {
      std::printf("[%-7s] %s: %s\n", f.level.c_str(), f.check.c_str(), f.detail.c_str());
      if (!f.fix.empty()) std::printf("          fix: %s\n", f.fix.c_str());
    }
    std::printf("%d problem%s\n", problems, problems == 1 ? "" : "s");
  }
  return problems > 0 ? 1 : 0;
}

}  // namespace

std::function<int()> AddDoctorCommand(CLI::App* app, DoctorOptions* o) {
  auto* cmd = app->add_subcommand(
      "doctor", "check RDMA devices, locked memory, UCX, GPU registration and addresses");
  cmd->add_flag("--json", o->json, "print the findings as JSON");
  cmd->add_option("--params-mib", o->params_mib, "a shard's parameters, for the memlock check");
  cmd->add_option("--staging-mib", o->staging_mib, "staging slot per worker (MiB)");
  cmd->add_option("--workers", o->workers, "workers per shard, for the memlock check");
  cmd->add_option("--cluster", o->cluster_file, "cluster spec: which address each task uses");
  return [o] { return RunDoctor(*o); };
}

}  // namespace tessera::tools
