// The coordinator as a ps task's shard sees it, wherever it runs: hosted in
// this process (HostedCoordinator) or reached over a link (CoordinatorLink).
// The shard reports steps, answers checkpoint rounds and tells of the chunks
// it creates through it, and knows nothing of coord/. Progress thread only.
#pragma once

#include "core/bytes.h"
#include "wire/messages.h"

namespace tessera::server {

class CoordinatorPort {
 public:
  virtual ~CoordinatorPort() = default;
  // In this process: it hears of steps at once, and learns the chunks
  // created here (a restarted host learns its own placement back from them).
  virtual bool hosted() const = 0;
  // Step reports are taken now (a link is up and joined; the hosted one
  // always): else they wait in the shard's counter for the next join.
  virtual bool joined() const = 0;
  // A frame from this task: a checkpoint round's reply, a step report.
  virtual void Send(MessageBytes frame) = 0;
  virtual void ReportSteps(const wire::StepsApplied& report) = 0;
  // `created`: the chunks (and whether each holds a value), as in a join.
  virtual void ChunksCreated(const wire::Join& created) = 0;
};

}  // namespace tessera::server
