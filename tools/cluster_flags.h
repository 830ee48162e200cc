// The flags every role takes to know the cluster and its own task, in
// TensorFlow's spellings; TF_CONFIG is used when no flags are given.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "tessera/cluster.h"

namespace tessera::tools {

struct ClusterFlags {
  std::string ps_hosts, worker_hosts, chief_hosts, coordinator_host, cluster_file;
  std::string job_name;
  int task_index = -1;
  std::string secret_file;
  // --transport, else TESSERA_TRANSPORT (what `tessera launch` gives its
  // tasks), else tcp (Tessera's own sockets).
  std::string transport = DefaultTransport();
  static std::string DefaultTransport();
  // --session-protection, else TESSERA_SESSION_PROTECTION, else auto.
  std::string session_protection = DefaultSessionProtection();
  static std::string DefaultSessionProtection();

  void Add(CLI::App* app, const std::string& default_job);
  // For `tessera status`, which is no task of the cluster: the cluster's
  // flags without --job/--task.
  void AddClusterOnly(CLI::App* app);
  // Flags, else --cluster FILE, else TF_CONFIG.
  Result<TfConfig> Resolve() const;
  // The cluster alone, which needs ps tasks but no workers (an observer
  // asks only the ps tasks and the coordinator).
  Result<ClusterSpec> ResolveCluster() const;
  Result<std::string> Secret() const;
};

}  // namespace tessera::tools
