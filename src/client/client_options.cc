// ClientOptions::FromEnv: what a worker's environment says about its cluster,
// its task, the secret, the transport and the log level.
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "core/log.h"
#include "core/secret.h"
#include "tessera/client.h"

namespace tessera {
namespace {

constexpr std::string_view kTf1Flags[] = {"ps_hosts", "worker_hosts", "chief_hosts", "job_name",
                                          "task_index"};

// TensorFlow 1's cluster flags among argv, as {name: value}; other arguments
// belong to the trainer and are left alone.
Result<std::map<std::string, std::string>> Tf1Flags(int argc, const char* const* argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc && argv != nullptr; ++i) {
    std::string_view arg = argv[i] == nullptr ? "" : argv[i];
    if (!arg.starts_with("--")) continue;
    arg.remove_prefix(2);
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    bool known = false;
    for (auto flag : kTf1Flags) known = known || flag == name;
    if (!known) continue;
    if (eq != std::string_view::npos) {
      flags[std::string(name)] = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc && argv[i + 1] != nullptr) {
      flags[std::string(name)] = argv[++i];
    } else {
      return Status::InvalidArgument("--" + std::string(name) + " has no value");
    }
  }
  return flags;
}

Result<TfConfig> TfConfigFromFlags(const std::map<std::string, std::string>& flags) {
  auto get = [&](const char* name) {
    auto it = flags.find(name);
    return it == flags.end() ? std::string() : it->second;
  };
  for (const char* needed : {"ps_hosts", "job_name", "task_index"}) {
    if (get(needed).empty()) {
      return Status::InvalidArgument(std::string("TensorFlow 1 flags given without --") + needed);
    }
  }
  if (get("worker_hosts").empty() && get("chief_hosts").empty()) {
    return Status::InvalidArgument("TensorFlow 1 flags given without --worker_hosts");
  }
  auto cluster =
      ClusterSpec::FromHostLists(get("ps_hosts"), get("worker_hosts"), get("chief_hosts"));
  if (!cluster.ok()) return cluster.status();
  const std::string index_text = get("task_index");
  char* end = nullptr;
  const long index = std::strtol(index_text.c_str(), &end, 10);
  if (end == index_text.c_str() || *end != '\0' || index < 0 || index > INT32_MAX) {
    return Status::InvalidArgument("--task_index='" + index_text + "' is not an index");
  }
  TfConfig cfg{*cluster, {get("job_name"), static_cast<int>(index)}};
  auto addr = cfg.cluster.address(cfg.task);
  if (!addr.ok()) return addr.status().WithContext("--job_name/--task_index");
  return cfg;
}

}  // namespace

Result<ClientOptions> ClientOptions::FromEnv(int argc, const char* const* argv) {
  auto flags = Tf1Flags(argc, argv);
  if (!flags.ok()) return flags.status();
  const char* tf_config = std::getenv("TF_CONFIG");
  if (flags->empty() && (tf_config == nullptr || *tf_config == '\0')) {
    return Status::NotFound(
        "no cluster: set TF_CONFIG, or pass --ps_hosts, --worker_hosts, --job_name and "
        "--task_index (tessera launch sets TF_CONFIG)");
  }
  Result<TfConfig> cfg = flags->empty() ? TfConfigFromEnv() : TfConfigFromFlags(*flags);
  if (!cfg.ok()) return cfg.status();
  ClientOptions options;
  options.cluster = cfg->cluster;
  options.task = cfg->task;
  // TensorFlow's evaluator reads what the workers train: here it pulls.
  options.read_only = cfg->task.job == "evaluator";
  if (const char* ro = std::getenv("TESSERA_READ_ONLY"); ro && *ro) {
    const std::string_view v = ro;
    if (v != "0" && v != "1") {
      return Status::InvalidArgument("TESSERA_READ_ONLY='" + std::string(v) + "': expected 0 or 1");
    }
    options.read_only = options.read_only || v == "1";
  }
  auto secret = LoadSecret();
  if (!secret.ok()) return secret.status();
  options.secret = *secret;
  if (const char* weak = std::getenv("TESSERA_ALLOW_WEAK_SECRET")) {
    options.allow_weak_secret = std::string_view(weak) == "1";
  }
  TESSERA_RETURN_IF_ERROR(CheckSecretStrength(options.secret, options.allow_weak_secret));
  if (const char* transport = std::getenv("TESSERA_TRANSPORT"); transport && *transport) {
    const std::string_view t = transport;
    if (t != "tcp" && t != "ucx" && t != "verbs" && t != "auto") {
      return Status::InvalidArgument("TESSERA_TRANSPORT='" + std::string(t) +
                                     "': expected tcp, ucx, verbs or auto");
    }
    options.transport = transport;
  }
  if (const char* p = std::getenv("TESSERA_SESSION_PROTECTION"); p && *p) {
    auto protection = ParseSessionProtection(p);
    if (!protection.ok()) return protection.status().WithContext("TESSERA_SESSION_PROTECTION");
    options.session_protection = *protection;
  }
  if (const char* device = std::getenv("TESSERA_CUDA_DEVICE"); device && *device) {
    char* end = nullptr;
    const long d = std::strtol(device, &end, 10);
    if (end == device || *end != '\0' || d < 0 || d > 1024) {
      return Status::InvalidArgument("TESSERA_CUDA_DEVICE='" + std::string(device) +
                                     "' is not a GPU index");
    }
    options.cuda_device = static_cast<int>(d);
  }
  TESSERA_RETURN_IF_ERROR(LogLevelFromEnv().status());
  return options;
}

}  // namespace tessera
