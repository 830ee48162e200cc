// An observer's authenticated connection to one task of a cluster: it may
// only ask for the task's status (what `tessera status` prints, and what
// `tessera bench` reads a shard's allocation count from).
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/cluster.h"
#include "tessera/status.h"

namespace tessera::tools {

class Observer {
 public:
  // Connects over `backend` (a transport::ContextOptions backend) and
  // authenticates with the cluster's secret; each step waits at most
  // `timeout`.
  static Result<std::unique_ptr<Observer>> Connect(const std::string& backend,
                                                   const TaskAddress& task,
                                                   const std::string& secret,
                                                   std::chrono::milliseconds timeout);
  ~Observer();
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // The task's status JSON (server/shard_status.cc).
  Result<nlohmann::json> AskStatus();

 private:
  struct State;
  explicit Observer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tessera::tools
