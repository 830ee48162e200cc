#include "tools/status.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/secret.h"
#include "tools/observer.h"

namespace tessera::tools {
namespace {

using nlohmann::json;

std::string Workers(const json& j) {
  std::string out;
  for (const auto& w : j.at("workers")) {
    if (!out.empty()) out += ", ";
    out += w.at("task").get<std::string>() + (w.at("cuda_ipc").get<bool>() ? " (CUDA IPC)" : "");
  }
  return out.empty() ? "none" : out;
}

}  // namespace

int RunStatus(const StatusOptions& o) {
  auto cluster = o.cluster.ResolveCluster();
  if (!cluster.ok()) {
    fprintf(stderr, "tessera status: %s\n", cluster.status().ToString().c_str());
    return 2;
  }
  auto secret = o.cluster.Secret();
  if (!secret.ok()) {
    fprintf(stderr, "tessera status: %s\n", secret.status().ToString().c_str());
    return 2;
  }
  std::vector<TaskId> tasks;
  for (int i = 0; i < cluster->num_tasks("ps"); ++i) tasks.push_back({"ps", i});
  for (int i = 0; i < cluster->num_tasks("coordinator"); ++i) tasks.push_back({"coordinator", i});
  json all = json::array();
  int failed = 0;
  for (const TaskId& t : tasks) {
    const TaskAddress addr = cluster->address(t).value();
    auto observer = Observer::Connect(o.cluster.transport, addr, *secret,
                                      std::chrono::milliseconds(o.timeout_ms));
    auto j = observer.ok() ? (*observer)->AskStatus() : Result<json>(observer.status());
    if (!j.ok()) {
      failed++;
      all.push_back(
          {{"task", t.ToString()}, {"address", addr.ToString()}, {"error", j.status().ToString()}});
      continue;
    }
    (*j)["address"] = addr.ToString();
    all.push_back(*j);
  }
  if (o.json) {
    printf("%s\n", all.dump(2).c_str());
  } else {
    for (const auto& j : all) {
      // A task's answer is read as it came: a field of the wrong type says
      // so instead of ending the command.
      try {
        printf("%s (%s)\n", j.at("task").get<std::string>().c_str(),
               j.at("address").get<std::string>().c_str());
        if (j.contains("error")) {
          printf("  unreachable: %s\n", j.at("error").get<std::string>().c_str());
          continue;
        }
        const auto& s = j.at("stats");
        if (j.contains("memory")) {
          printf("  parameters: %s%s\n", j.at("memory").get<std::string>().c_str(),
                 j.at("staged_through_host").get<bool>() ? ", staged through host memory" : "");
        } else {
          printf("  parameters: none (the coordinator alone)\n");
        }
        printf("  transport:  %s\n", j.at("transport").get<std::string>().c_str());
        printf("  workers:    %s\n", Workers(j).c_str());
        printf("  tensors %llu, pushes %llu, pulls %llu, sync steps %llu, host-staged bytes %llu\n",
               s.at("tensors").get<unsigned long long>(),
               s.at("pushes_applied").get<unsigned long long>(),
               s.at("pulls_served").get<unsigned long long>(),
               s.at("sync_steps_applied").get<unsigned long long>(),
               s.at("host_staged_bytes").get<unsigned long long>());
        if (j.contains("global_step")) {
          printf("  global step %llu\n", j.at("global_step").get<unsigned long long>());
        }
        if (j.contains("step_reports")) {
          const auto& r = j.at("step_reports");
          std::string per_task;
          for (const auto& n : r.at("from_ps_tasks")) {
            per_task += (per_task.empty() ? "" : ", ") + std::to_string(n.get<uint64_t>());
          }
          printf("  step reports received: from ps tasks [%s], from workers %llu\n",
                 per_task.c_str(), r.at("from_workers").get<unsigned long long>());
        }
      } catch (const nlohmann::json::exception& e) {
        printf("  malformed status reply: %s\n", e.what());
        failed++;
      }
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace tessera::tools
