#include "tools/doctor.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpu/cuda.h"
#include "tessera/cluster.h"
#include "transport/probe.h"
#include "transport/sockaddr.h"

namespace tessera::tools {
namespace {

namespace fs = std::filesystem;

using Finding = transport::ProbeFinding;

std::string Mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

// The RDMA device (and port) whose GID table names this network interface.
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
        const std::string rdma = transport::RdmaDeviceOn(name);
        return name +
               (rdma.empty() ? " (no RDMA device: tcp only)" : " (RDMA device " + rdma + ")");
      }
    }
    return "";
  };
  for (const auto& [name, ip] : ifaces) {
    const std::string rdma = transport::RdmaDeviceOn(name);
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
  std::vector<Finding> findings = {transport::ProbeRdmaDevices(),
                                   CheckMemlock(o),
                                   transport::ProbeUcx(),
                                   transport::ProbeTcpCongestion(),
                                   transport::ProbeSessionProtection(),
                                   CheckGpu(),
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
