// ServerOptions::stop_when_workers_leave: a server started by an engine
// ends once its job's workers are done with it (WorkerPresence decides
// when), and publishes the verdict (EndSignals). Off the coordinator the
// end also waits for the coordinator's own stop: its final checkpoint needs
// this task serving. Progress thread only.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "server/end_signals.h"
#include "server/worker_presence.h"
#include "transport/transport.h"

namespace tessera::server {

class WorkersLeaving {
 public:
  struct Options {
    int num_workers = 0;
    std::chrono::milliseconds grace{0};  // ServerOptions::workers_grace
    // Whether the coordinator is gone (or hosted here): the end may come.
    std::function<bool()> coordinator_gone;
  };
  WorkersLeaving(transport::Context& ctx, EndSignals& end, Options options);

  void Connected(uint32_t rank, const std::string& task) { presence_.Connected(rank, task); }
  // One of the rank's connections ended; `said_bye`: on purpose.
  void Left(uint32_t rank, bool said_bye);
  // Publishes the verdict once there is one (and the coordinator is gone),
  // else schedules the next look when the grace time may bring one.
  void Check();
  void Stop() { stopping_ = true; }

 private:
  transport::Context& ctx_;
  EndSignals& end_;
  const Options options_;
  WorkerPresence presence_;
  bool check_scheduled_ = false;
  bool stopping_ = false;
};

}  // namespace tessera::server
