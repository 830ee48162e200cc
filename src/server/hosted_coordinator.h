// The coordinator's service (coord::Service) hosted in a server process:
// built from the server's options, it lends the service the server's
// connections and loop, and is the hosted ps task's CoordinatorPort.
#pragma once

#include <memory>

#include "coord/service.h"
#include "server/coordinator_host.h"
#include "server/role.h"

namespace tessera::server {

class HostedCoordinator final : public CoordinatorHost {
 public:
  HostedCoordinator(const ServerOptions& options, Role role);
  ~HostedCoordinator() override;
  HostedCoordinator(const HostedCoordinator&) = delete;
  HostedCoordinator& operator=(const HostedCoordinator&) = delete;

  Status Open(Hooks hooks) override;
  void Start(std::function<void(const wire::JoinReply&)> local_joined) override;
  void OnWorkerRequest(const Worker& from, const wire::Header& h,
                       std::span<const uint8_t> frame) override;
  Status OnLinkFrame(PeerId from, int task_index, const wire::Header& h,
                     std::span<const uint8_t> frame) override;
  void OnPeerGone(PeerId peer) override {
    if (service_) service_->OnPeerGone(peer);
  }
  void SaveFinal(std::function<void()> done) override;
  void Stop() override;
  uint64_t global_step() const override { return service_ ? service_->global_step() : 0; }
  void AddStats(ServerStats* stats) const override;

  // CoordinatorPort: the hosted ps task's side, by call.
  bool hosted() const override { return true; }
  bool joined() const override { return true; }
  void Send(MessageBytes frame) override;
  void ReportSteps(const wire::StepsApplied& report) override { service_->OnLocalSteps(report); }
  void ChunksCreated(const wire::Join& created) override {
    service_->OnLocalChunksCreated(created);
  }

 private:
  coord::ServiceOptions options_;
  transport::Context* ctx_ = nullptr;
  // From Open on: a server whose start failed before it stops without one.
  std::unique_ptr<coord::Service> service_;
  bool stopping_ = false;
};

}  // namespace tessera::server
