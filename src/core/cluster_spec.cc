#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/bounded_file.h"
#include "tessera/cluster.h"

namespace tessera {
namespace {

const std::vector<TaskAddress> kNoTasks;

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Result<std::vector<TaskAddress>> ParseList(const std::string& job,
                                           const std::vector<std::string>& items) {
  std::vector<TaskAddress> out;
  for (const auto& item : items) {
    auto addr = TaskAddress::Parse(item);
    if (!addr.ok()) return addr.status().WithContext("job '" + job + "'");
    out.push_back(*addr);
  }
  return out;
}

Result<ClusterSpec> FromJsonValue(const nlohmann::json& j) {
  if (!j.is_object()) {
    return Status::InvalidArgument("cluster spec must be a JSON object of job -> [\"host:port\"]");
  }
  ClusterSpec spec;
  for (const auto& [job, list] : j.items()) {
    if (!list.is_array()) {
      return Status::InvalidArgument("cluster spec: job '" + job + "' must be a list of host:port");
    }
    std::vector<std::string> items;
    for (const auto& v : list) {
      if (!v.is_string()) {
        return Status::InvalidArgument("cluster spec: job '" + job + "' has a non-string task");
      }
      items.push_back(v.get<std::string>());
    }
    auto tasks = ParseList(job, items);
    if (!tasks.ok()) return tasks.status();
    TESSERA_RETURN_IF_ERROR(spec.AddJob(job, std::move(*tasks)));
  }
  return spec;
}

}  // namespace

const char* SessionProtectionName(SessionProtection protection) {
  switch (protection) {
    case SessionProtection::kOn:
      return "on";
    case SessionProtection::kOff:
      return "off";
    case SessionProtection::kIntegrity:
      return "integrity";
    default:
      return "auto";
  }
}

Result<SessionProtection> ParseSessionProtection(const std::string& name) {
  for (auto p : {SessionProtection::kAuto, SessionProtection::kOn, SessionProtection::kOff,
                 SessionProtection::kIntegrity}) {
    if (name == SessionProtectionName(p)) return p;
  }
  return Status::InvalidArgument("session protection '" + name +
                                 "' is none of auto, on, off and integrity");
}

Result<TaskAddress> TaskAddress::Parse(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    return Status::InvalidArgument("'" + host_port + "' is not host:port");
  }
  std::string host = host_port.substr(0, colon);
  // A NUL would cut the name short where it meets C (getaddrinfo); other
  // control characters have no place in a host name and forge log lines.
  if (std::any_of(host.begin(), host.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return Status::InvalidArgument(
        "a host name holds a control character (NUL, newline, "
        "escape...): refused");
  }
  const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  // An IPv6 literal comes in brackets ("[::1]:2222"), and only it: what
  // parses then prints back the same (ToString brackets a host with ':').
  if (host.find_first_of("[]") != std::string::npos ||
      (!bracketed && host.find(':') != std::string::npos)) {
    return Status::InvalidArgument("'" + host_port +
                                   "' is not host:port (an IPv6 address goes in brackets: "
                                   "[::1]:2222)");
  }
  const std::string port_text = host_port.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    return Status::InvalidArgument("'" + host_port + "' has an invalid port '" + port_text + "'");
  }
  return TaskAddress{host, static_cast<uint16_t>(port)};
}

Status ClusterSpec::AddJob(const std::string& job, std::vector<TaskAddress> tasks) {
  if (job.empty()) return Status::InvalidArgument("cluster spec: empty job name");
  if (jobs_.count(job)) return Status::AlreadyExists("cluster spec: job '" + job + "' given twice");
  if ((job == "chief" || job == "coordinator") && tasks.size() > 1) {
    return Status::InvalidArgument("cluster spec: at most one " + job + " task (got " +
                                   std::to_string(tasks.size()) + ")");
  }
  // Two tasks at one address would answer for each other (the second ps
  // task listening there fails, or serves the first one's workers).
  for (size_t i = 0; i < tasks.size(); ++i) {
    for (size_t k = 0; k < i; ++k) {
      if (tasks[k] == tasks[i]) {
        return Status::InvalidArgument("cluster spec: " + tasks[i].ToString() +
                                       " is given twice in job '" + job + "' (tasks " +
                                       std::to_string(k) + " and " + std::to_string(i) + ")");
      }
    }
    for (const auto& [other, list] : jobs_) {
      if (std::find(list.begin(), list.end(), tasks[i]) != list.end()) {
        return Status::InvalidArgument("cluster spec: " + tasks[i].ToString() +
                                       " is given to job '" + other + "' and to job '" + job + "'");
      }
    }
  }
  jobs_[job] = std::move(tasks);
  return Status::Ok();
}

const std::vector<TaskAddress>& ClusterSpec::tasks(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? kNoTasks : it->second;
}

Result<TaskAddress> ClusterSpec::address(const TaskId& task) const {
  const auto& list = tasks(task.job);
  if (task.index < 0 || task.index >= static_cast<int>(list.size())) {
    return Status::NotFound("no task " + task.ToString() + " in the cluster spec (job '" +
                            task.job + "' has " + std::to_string(list.size()) + " tasks)");
  }
  return list[task.index];
}

TaskId ClusterSpec::chief() const {
  if (num_tasks("chief") > 0) return {"chief", 0};
  return {"worker", 0};
}

TaskId ClusterSpec::coordinator() const {
  if (separate_coordinator()) return {"coordinator", 0};
  return {"ps", 0};
}

Result<int> ClusterSpec::worker_rank(const TaskId& task) const {
  int chiefs = num_tasks("chief");
  if (task.job == "chief" && task.index == 0 && chiefs == 1) return 0;
  if (task.job == "worker" && task.index >= 0 && task.index < num_tasks("worker")) {
    return chiefs + task.index;
  }
  return Status::NotFound(task.ToString() + " is not a worker task of the cluster spec");
}

Result<TaskId> ClusterSpec::worker_task(int rank) const {
  const int chiefs = num_tasks("chief") == 1 ? 1 : 0;
  if (rank < 0 || rank >= chiefs + num_tasks("worker")) {
    return Status::NotFound("worker rank " + std::to_string(rank) + " is not in the cluster spec");
  }
  if (rank < chiefs) return TaskId{"chief", 0};
  return TaskId{"worker", rank - chiefs};
}

Status ClusterSpec::Validate() const {
  if (num_tasks("ps") == 0) return Status::InvalidArgument("cluster spec has no ps tasks");
  if (num_workers() == 0) {
    return Status::InvalidArgument("cluster spec has no worker (or chief) tasks");
  }
  return Status::Ok();
}

std::string ClusterSpec::DifferenceFrom(const ClusterSpec& theirs, bool workers_too) const {
  auto list = [](const std::vector<TaskAddress>& tasks) {
    std::string out = "[";
    for (const auto& t : tasks) out += (out.size() > 1 ? ", " : "") + t.ToString();
    return out + "]";
  };
  std::string out;
  auto note = [&](const std::string& what) { out += (out.empty() ? "" : "; ") + what; };
  for (const char* job : {"ps", "coordinator"}) {
    if (tasks(job) != theirs.tasks(job)) {
      note(std::string(job) + " tasks are " + list(tasks(job)) + " here but " +
           list(theirs.tasks(job)) + " there");
    }
  }
  if (!workers_too) return out;
  if (num_workers() != theirs.num_workers()) {
    note(std::to_string(num_workers()) + " workers here but " +
         std::to_string(theirs.num_workers()) + " there");
  } else if (num_tasks("chief") != theirs.num_tasks("chief")) {
    note(std::string("a chief task ") +
         (num_tasks("chief") ? "here but not there" : "there but not here"));
  }
  return out;
}

std::string ClusterSpec::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [job, list] : jobs_) {
    auto arr = nlohmann::json::array();
    for (const auto& t : list) arr.push_back(t.ToString());
    j[job] = arr;
  }
  return j.dump();
}

Result<ClusterSpec> ClusterSpec::FromJson(const std::string& json_text) {
  auto j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("cluster spec: not valid JSON");
  return FromJsonValue(j);
}

Result<ClusterSpec> ClusterSpec::FromJsonFile(const std::string& path) {
  // Tens of bytes a task: the bound leaves room for clusters of many
  // thousands of tasks and keeps a file that is something else out.
  constexpr uint64_t kMaxSpecFileBytes = 16u << 20;
  auto text = ReadBoundedFile(path, kMaxSpecFileBytes, "the cluster spec file");
  if (!text.ok()) return text.status();
  auto spec = FromJson(*text);
  if (!spec.ok()) return spec.status().WithContext(path);
  return spec;
}

Result<ClusterSpec> ClusterSpec::FromHostLists(const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& chief_hosts) {
  ClusterSpec spec;
  for (const auto& [job, list] : {std::pair<std::string, const std::string*>{"ps", &ps_hosts},
                                  {"worker", &worker_hosts},
                                  {"chief", &chief_hosts}}) {
    auto items = SplitComma(*list);
    if (items.empty()) continue;
    auto tasks = ParseList(job, items);
    if (!tasks.ok()) return tasks.status();
    TESSERA_RETURN_IF_ERROR(spec.AddJob(job, std::move(*tasks)));
  }
  return spec;
}

Result<TfConfig> ParseTfConfig(const std::string& json_text) {
  auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument("TF_CONFIG is not a JSON object");
  if (!j.contains("cluster")) return Status::InvalidArgument("TF_CONFIG has no \"cluster\"");
  auto cluster = FromJsonValue(j["cluster"]);
  if (!cluster.ok()) return cluster.status().WithContext("TF_CONFIG");
  TfConfig cfg{*cluster, {}};
  if (!j.contains("task") || !j["task"].is_object()) {
    return Status::InvalidArgument("TF_CONFIG has no \"task\" object");
  }
  const auto& task = j["task"];
  if (!task.contains("type") || !task["type"].is_string()) {
    return Status::InvalidArgument("TF_CONFIG task has no string \"type\"");
  }
  const nlohmann::json& index = task.contains("index") ? task["index"] : nlohmann::json();
  const bool index_ok = index.is_number_unsigned()
                            ? index.get<uint64_t>() <= INT32_MAX
                            : index.is_number_integer() && index.get<int64_t>() >= 0 &&
                                  index.get<int64_t>() <= INT32_MAX;
  if (!index_ok) {
    return Status::InvalidArgument("TF_CONFIG task has no integer \"index\" of 0 or more");
  }
  cfg.task.job = task["type"].get<std::string>();
  cfg.task.index = task["index"].get<int>();
  // TensorFlow (and Kubeflow's TFJob) leave the evaluator out of the
  // cluster it reads from: it is nobody's peer.
  auto addr = cfg.cluster.address(cfg.task);
  if (!addr.ok() && cfg.task.job != "evaluator") {
    // Invalid, not missing: NotFound means "no TF_CONFIG" to callers.
    return Status::InvalidArgument(addr.status().message()).WithContext("TF_CONFIG");
  }
  return cfg;
}

Result<TfConfig> TfConfigFromEnv() {
  const char* text = std::getenv("TF_CONFIG");
  if (text == nullptr || *text == '\0') return Status::NotFound("TF_CONFIG is not set");
  return ParseTfConfig(text);
}

std::string ToTfConfigJson(const ClusterSpec& cluster, const TaskId& task) {
  nlohmann::json j;
  j["cluster"] = nlohmann::json::parse(cluster.ToJson());
  j["task"] = {{"type", task.job}, {"index", task.index}};
  return j.dump();
}

}  // namespace tessera
