// The worker steps a shard's pushes count (StepCounter), reported to the
// coordinator through its CoordinatorPort: at once to a coordinator hosted
// in this process (a call), else once per turn of the loop, so that the
// async steps of every push handled in one turn travel in one report.
// Without a joined link the reports wait, and go when it (re)joins.
// Progress thread only.
#pragma once

#include <vector>

#include "server/coordinator_port.h"
#include "server/step_counter.h"
#include "transport/transport.h"

namespace tessera::server {

class StepReporter {
 public:
  // `coordinator` outlives the reporter.
  StepReporter(transport::Context& ctx, CoordinatorPort& coordinator)
      : ctx_(ctx), coordinator_(coordinator) {}

  void CountAsync() {
    counter_.CountAsync();
    Schedule();
  }
  // StepCounter::CountSync, then reported.
  void CountSync(uint32_t rank, uint64_t step, uint32_t replicas, uint32_t parts) {
    counter_.CountSync(rank, step, replicas, parts);
    Schedule();
  }
  // Sends what is ready, if the coordinator is reachable.
  void Flush();
  // For a join: the last sync step reports sent (a restarted coordinator
  // counts the global step from them), then those counted since.
  void AppendJoinFrames(std::vector<MessageBytes>* frames);
  void Stop() { stopping_ = true; }

 private:
  void Schedule();

  transport::Context& ctx_;
  CoordinatorPort& coordinator_;
  StepCounter counter_;
  bool posted_ = false;
  bool stopping_ = false;
  // Kept across flushes (core/borrowed.h): no allocation per report.
  std::vector<wire::StepsApplied> reports_;
};

}  // namespace tessera::server
