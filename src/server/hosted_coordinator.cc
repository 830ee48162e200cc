#include "server/hosted_coordinator.h"

#include <algorithm>

namespace tessera::server {

HostedCoordinator::HostedCoordinator(const ServerOptions& options, Role role) {
  coord::ServiceOptions& o = options_;
  o.name = options.job + " task " + std::to_string(options.task_index);
  o.num_shards = options.cluster.num_tasks("ps");
  o.num_workers = options.cluster.num_workers();
  o.local_shard = HoldsTensors(role) ? options.task_index : -1;
  o.cluster_json = options.cluster.ToJson();
  o.checkpoints.dir = options.checkpoint_dir;
  o.checkpoints.every = options.checkpoint_every;
  o.checkpoints.every_steps = options.checkpoint_every_steps;
  o.checkpoints.keep = std::max(1, options.keep_checkpoints);
  o.checkpoints.timeout = options.checkpoint_timeout;
  o.restore = options.restore;
  o.new_run = options.new_run;
  o.accept_legacy_checkpoints = options.accept_legacy_checkpoints;
}

HostedCoordinator::~HostedCoordinator() = default;

Status HostedCoordinator::Open(Hooks hooks) {
  ctx_ = hooks.ctx;
  options_.checkpoints.key = hooks.checkpoint_key;
  coord::Service::Host host;
  host.send = std::move(hooks.send_to_peer);
  if (hooks.to_local_shard) {
    host.send_to_local_shard = [this, to = std::move(hooks.to_local_shard)](MessageBytes frame) {
      ctx_->Post([this, to, f = std::move(frame)]() mutable {
        if (!stopping_) to(std::move(f));
      });
    };
  }
  host.post = [this](std::function<void()> fn) { ctx_->Post(std::move(fn)); };
  host.post_after = [this](std::chrono::milliseconds d, std::function<void()> fn) {
    ctx_->PostAfter(d, std::move(fn));
  };
  service_ = std::make_unique<coord::Service>(options_, std::move(host));
  return service_->Open();
}

void HostedCoordinator::Start(std::function<void(const wire::JoinReply&)> local_joined) {
  service_->Start();
  if (!local_joined) return;
  // The hosted task's table is empty here (it just started): the join says
  // so. The answer comes once every ps task joined: what to restore, and
  // the global step (rebuilt, after a restart) its sync tensors resume at.
  service_->JoinLocal(wire::Join{},
                      [this, joined = std::move(local_joined)](const wire::JoinReply& reply) {
                        if (!stopping_) joined(reply);
                      });
}

void HostedCoordinator::OnWorkerRequest(const Worker& from, const wire::Header& h,
                                        std::span<const uint8_t> frame) {
  const coord::WorkerRef ref{from.peer, from.task,
                             from.reader ? coord::WorkerRef::kNoRank : from.rank, from.reader};
  service_->OnWorkerRequest(ref, h, frame);
}

Status HostedCoordinator::OnLinkFrame(PeerId from, int task_index, const wire::Header& h,
                                      std::span<const uint8_t> frame) {
  return service_->OnShardFrame(from, task_index, h, frame);
}

void HostedCoordinator::SaveFinal(std::function<void()> done) {
  if (!service_) return done();
  service_->SaveFinal(std::move(done));
}

void HostedCoordinator::Stop() {
  stopping_ = true;
  if (service_) service_->Stop();
}

void HostedCoordinator::Send(MessageBytes frame) {
  // Posted: the hosted task's frame is handled as a link's would be, after
  // the turn of the loop that sent it.
  ctx_->Post([this, f = std::move(frame)] {
    if (!stopping_) service_->OnLocalShardFrame(f);
  });
}

void HostedCoordinator::AddStats(ServerStats* s) const {
  if (!service_) return;
  s->checkpoints_written = service_->checkpoint_rounds().written();
  s->checkpoint_rounds_failed = service_->checkpoint_rounds().failed();
  s->last_checkpoint_failure = service_->checkpoint_rounds().last_failure();
  s->step_reports_from_ps = service_->step_reports_by_shard();
}

}  // namespace tessera::server
