#include "tools/cluster_flags.h"

#include <cstdlib>

#include "core/secret.h"

namespace tessera::tools {

void ClusterFlags::AddClusterOnly(CLI::App* app) {
  app->add_option("--ps_hosts", ps_hosts, "comma-separated host:port of the ps tasks");
  app->add_option("--worker_hosts", worker_hosts, "comma-separated host:port of the workers");
  app->add_option("--chief_hosts", chief_hosts, "host:port of a dedicated chief task");
  app->add_option("--cluster", cluster_file, "JSON cluster spec file ({\"ps\": [...], ...})");
  app->add_option(
      "--coordinator_host", coordinator_host,
      "host:port of a separate coordinator task (default: ps task 0 is the coordinator)");
  app->add_option("--secret-file", secret_file,
                  "file holding the cluster secret (else TESSERA_SECRET / TESSERA_SECRET_FILE)");
  app->add_option("--transport", transport,
                  "tcp (Tessera's sockets), ucx, verbs, or auto (verbs where an RDMA device is)")
      ->capture_default_str();
  app->add_option("--session-protection", session_protection,
                  "auto (sessions that leave the host are authenticated and encrypted after "
                  "their handshake; loopback ones are not), on, integrity (authenticated, not "
                  "encrypted) or off (tcp only)")
      ->check(CLI::IsMember({"auto", "on", "integrity", "off"}))
      ->capture_default_str();
}

void ClusterFlags::Add(CLI::App* app, const std::string& default_job) {
  job_name = default_job;
  AddClusterOnly(app);
  app->add_option("--job_name,--job", job_name, "this task's job (ps, worker, chief, coordinator)")
      ->capture_default_str();
  app->add_option("--task_index,--task", task_index, "this task's index in its job")
      ->check(CLI::Range(0, 1 << 20));
}

Result<ClusterSpec> ClusterFlags::ResolveCluster() const {
  ClusterSpec spec;
  if (!ps_hosts.empty() || !worker_hosts.empty()) {
    auto s = ClusterSpec::FromHostLists(ps_hosts, worker_hosts, chief_hosts);
    if (!s.ok()) return s.status();
    spec = std::move(*s);
    if (!coordinator_host.empty()) {
      auto addr = TaskAddress::Parse(coordinator_host);
      if (!addr.ok()) return addr.status().WithContext("--coordinator_host");
      TESSERA_RETURN_IF_ERROR(spec.AddJob("coordinator", {*addr}));
    }
  } else if (!cluster_file.empty()) {
    auto s = ClusterSpec::FromJsonFile(cluster_file);
    if (!s.ok()) return s.status();
    spec = std::move(*s);
  } else {
    auto env = TfConfigFromEnv();
    if (!env.ok() && env.status().code() == StatusCode::kNotFound) {
      return Status::InvalidArgument(
          "no cluster given: pass --ps_hosts, --cluster FILE, or set TF_CONFIG");
    }
    if (!env.ok()) return env.status();
    spec = env->cluster;
  }
  if (spec.num_tasks("ps") == 0) return Status::InvalidArgument("cluster spec has no ps tasks");
  return spec;
}

Result<TfConfig> ClusterFlags::Resolve() const {
  TfConfig cfg;
  if (!ps_hosts.empty() || !worker_hosts.empty()) {
    auto spec = ClusterSpec::FromHostLists(ps_hosts, worker_hosts, chief_hosts);
    if (!spec.ok()) return spec.status();
    cfg.cluster = std::move(*spec);
    if (!coordinator_host.empty()) {
      auto addr = TaskAddress::Parse(coordinator_host);
      if (!addr.ok()) return addr.status().WithContext("--coordinator_host");
      TESSERA_RETURN_IF_ERROR(cfg.cluster.AddJob("coordinator", {*addr}));
    }
  } else if (!cluster_file.empty()) {
    auto spec = ClusterSpec::FromJsonFile(cluster_file);
    if (!spec.ok()) return spec.status();
    cfg.cluster = std::move(*spec);
  } else {
    auto env = TfConfigFromEnv();
    if (!env.ok() && env.status().code() == StatusCode::kNotFound) {
      return Status::InvalidArgument(
          "no cluster given: pass --ps_hosts/--worker_hosts, --cluster FILE, or set TF_CONFIG");
    }
    // A TF_CONFIG that is there but wrong: its own error, not "no cluster".
    if (!env.ok()) return env.status();
    cfg = std::move(*env);
    if (task_index >= 0) cfg.task = {job_name, task_index};
    TESSERA_RETURN_IF_ERROR(cfg.cluster.Validate().WithContext("TF_CONFIG"));
    auto addr = cfg.cluster.address(cfg.task);
    if (!addr.ok()) return addr.status().WithContext("TF_CONFIG");
    return cfg;
  }
  cfg.task = {job_name, task_index < 0 ? 0 : task_index};
  TESSERA_RETURN_IF_ERROR(cfg.cluster.Validate());
  auto addr = cfg.cluster.address(cfg.task);
  if (!addr.ok()) return addr.status();
  return cfg;
}

std::string ClusterFlags::DefaultTransport() {
  const char* env = std::getenv("TESSERA_TRANSPORT");
  return env != nullptr && *env ? env : "tcp";
}

std::string ClusterFlags::DefaultSessionProtection() {
  const char* env = std::getenv("TESSERA_SESSION_PROTECTION");
  return env != nullptr && *env ? env : "auto";
}

Result<std::string> ClusterFlags::Secret() const { return LoadSecret(secret_file); }

}  // namespace tessera::tools
