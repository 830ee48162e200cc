// ClusterSpec: which tasks make up the cluster, in TensorFlow's words.
//
//   {"ps": ["h1:2222", "h2:2222"], "worker": ["h3:2222"], "chief": ["h4:2222"]}
//
// Read from TensorFlow-style flags, a JSON file, or the TF_CONFIG environment
// variable ({"cluster": {...}, "task": {"type": "worker", "index": 0}}).
// An optional "coordinator" job (one task) runs the coordinator on its own;
// without it, ps task 0 is also the coordinator.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/export.h"
#include "tessera/status.h"

namespace tessera {

// Whether a session's frames are authenticated and encrypted after its
// handshake (Tessera's tcp: AES-256-GCM with keys from the handshake;
// docs/security.md). kAuto, the default: on for a connection that leaves
// the host, off over loopback, where an on-path party would need the host
// already. kIntegrity: authenticated, not encrypted (nobody on the path
// can alter a frame unnoticed, but anyone there can read it). Either side
// asking kOn encrypts; else either asking kIntegrity authenticates; else
// either saying kOff leaves it unprotected (the operator trusts the fabric).
// A client refuses a server that gives it less than it asked.
enum class SessionProtection : uint8_t { kAuto = 0, kOn = 1, kOff = 2, kIntegrity = 3 };
// "auto", "on", "off", "integrity".
TESSERA_EXPORT const char* SessionProtectionName(SessionProtection protection);
TESSERA_EXPORT Result<SessionProtection> ParseSessionProtection(const std::string& name);

struct TESSERA_EXPORT TaskAddress {
  std::string host;
  uint16_t port = 0;
  // "host:port", "[v6::address]:port".
  std::string ToString() const {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  bool operator==(const TaskAddress&) const = default;
  static Result<TaskAddress> Parse(const std::string& host_port);
};

struct TESSERA_EXPORT TaskId {
  std::string job;  // "ps", "worker", "chief"
  int index = 0;
  // "/job:ps/task:0", as TensorFlow names it.
  std::string ToString() const { return "/job:" + job + "/task:" + std::to_string(index); }
};

class TESSERA_EXPORT ClusterSpec {
 public:
  ClusterSpec() = default;

  // {"ps": ["host:port", ...], "worker": [...], "chief": [...]}
  static Result<ClusterSpec> FromJson(const std::string& json_text);
  static Result<ClusterSpec> FromJsonFile(const std::string& path);
  // Comma-separated host:port lists, as --ps_hosts/--worker_hosts gave them.
  static Result<ClusterSpec> FromHostLists(const std::string& ps_hosts,
                                           const std::string& worker_hosts,
                                           const std::string& chief_hosts = "");

  Status AddJob(const std::string& job, std::vector<TaskAddress> tasks);
  const std::vector<TaskAddress>& tasks(const std::string& job) const;
  int num_tasks(const std::string& job) const { return static_cast<int>(tasks(job).size()); }
  Result<TaskAddress> address(const TaskId& task) const;
  const std::map<std::string, std::vector<TaskAddress>>& jobs() const { return jobs_; }

  // Workers that push and pull: the chief task (if any) counts as one.
  int num_workers() const { return num_tasks("worker") + num_tasks("chief"); }
  // The chief: the "chief" task if the spec has one, else worker 0.
  TaskId chief() const;
  // Whether the coordinator runs as its own job, not inside ps task 0.
  bool separate_coordinator() const { return num_tasks("coordinator") > 0; }
  // The task that hosts the coordinator: the "coordinator" task if the spec
  // has one, else ps task 0.
  TaskId coordinator() const;
  // Position of a worker-like task among all workers (chief first if present).
  Result<int> worker_rank(const TaskId& task) const;
  // The task of a worker rank (the inverse of worker_rank).
  Result<TaskId> worker_task(int rank) const;

  // Checks there is at least one ps task and one worker-like task.
  Status Validate() const;
  // What differs between this spec and `theirs` in what every task must
  // agree on: the ps and coordinator tasks, in order, and how many workers
  // there are, with or without a chief ("" when they agree). Workers'
  // addresses may differ: no task connects to a worker. Without
  // `workers_too`, only the ps and coordinator tasks (what a read-only
  // client must agree on).
  std::string DifferenceFrom(const ClusterSpec& theirs, bool workers_too = true) const;
  std::string ToJson() const;

 private:
  std::map<std::string, std::vector<TaskAddress>> jobs_;
};

struct TESSERA_EXPORT TfConfig {
  ClusterSpec cluster;
  TaskId task;
};

// TensorFlow's TF_CONFIG format, exactly.
TESSERA_EXPORT Result<TfConfig> ParseTfConfig(const std::string& json_text);
// Reads TF_CONFIG from the environment; NotFound when it is unset.
TESSERA_EXPORT Result<TfConfig> TfConfigFromEnv();
TESSERA_EXPORT std::string ToTfConfigJson(const ClusterSpec& cluster, const TaskId& task);

}  // namespace tessera
