// A shard's membership of its cluster's coordinator: the coordinator hosted
// in this process, or a CoordinatorLink to the one another task hosts
// (joined, and joined again after either restarts, with this task's chunks
// and steps); the steps counted here and reported to it; a clean stop's bye.
// What the coordinator tells the shard (its first join's answer, checkpoint
// rounds' frames, its stop) goes to the shard's Events. Progress thread only.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "server/bye_round.h"
#include "server/coordinator_link.h"
#include "server/coordinator_port.h"
#include "server/peer_sessions.h"
#include "server/step_reporter.h"
#include "server/tables.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::server {

class CoordinatorMembership {
 public:
  // What the shard lends it; each outlives it.
  struct Lent {
    transport::Context* ctx = nullptr;
    const ServerOptions* options = nullptr;
    const PeerSessions* sessions = nullptr;  // the hello deadline the link keeps too
    const Tables* tables = nullptr;          // what a join tells
    ByeRound* bye = nullptr;
    CoordinatorPort* hosted = nullptr;  // hosted in this process, or null: the link
  };
  struct Events {
    // The first join's answer (what to restore), once.
    std::function<void(const wire::JoinReply&)> first_joined;
    std::function<void(std::span<const uint8_t>)> checkpoint;  // a round's frame
    // The coordinator said it stops, or the link to it ended.
    std::function<void()> coordinator_stopped;
    // The link ended: a checkpoint round under way will not finish.
    std::function<void()> link_closed;
  };
  CoordinatorMembership(Lent lent, Events events);
  CoordinatorMembership(const CoordinatorMembership&) = delete;
  CoordinatorMembership& operator=(const CoordinatorMembership&) = delete;

  // The link's first connect (none where the coordinator is hosted here).
  void Begin();
  CoordinatorPort& coordinator() { return lent_.hosted != nullptr ? *lent_.hosted : *link_; }
  StepReporter& steps() { return *steps_; }
  // Whether `ep` is the link, then handled here.
  bool OnLinkFrame(const transport::Endpoint* ep, std::span<const uint8_t> frame);
  bool OnLinkClosed(const transport::Endpoint* ep, const Status& why);
  // The hosted coordinator's answer to this task's join.
  void OnHostedJoined(const wire::JoinReply& reply);
  // A clean stop: the bye over the link, if joined.
  void SayBye();
  // Whether the coordinator stopped or cannot be reached (true where it is
  // hosted here).
  bool coordinator_gone() const;
  void Stop();

 private:
  // This task's join, as frames: its chunks (a restarted coordinator learns
  // placement back from them), the last sync steps it reported and those
  // counted since, then the join's end.
  std::vector<MessageBytes> JoinFrames();
  void OnLinkJoined(const wire::JoinReply& reply);
  std::unique_ptr<CoordinatorLink> OpenLink();

  const Lent lent_;
  const Events events_;
  // A ps task's link to the coordinator, when another task hosts it.
  std::unique_ptr<CoordinatorLink> link_;
  std::optional<StepReporter> steps_;
  bool joined_ = false;  // the first join was answered
  bool stopping_ = false;
};

}  // namespace tessera::server
