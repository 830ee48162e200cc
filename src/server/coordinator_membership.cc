#include "server/coordinator_membership.h"

#include "core/log.h"

namespace tessera::server {

CoordinatorMembership::CoordinatorMembership(Lent lent, Events events)
    : lent_(lent), events_(std::move(events)) {
  if (lent_.hosted == nullptr) link_ = OpenLink();
  steps_.emplace(*lent_.ctx, coordinator());
}

void CoordinatorMembership::Begin() {
  if (link_) lent_.ctx->Post([this] { link_->Connect(); });
}

std::unique_ptr<CoordinatorLink> CoordinatorMembership::OpenLink() {
  const ServerOptions& options = *lent_.options;
  CoordinatorLink::Options o{.cluster = options.cluster,
                             .task_index = options.task_index,
                             .secret = options.secret,
                             .protection = options.session_protection,
                             .hello_deadline = lent_.sessions->hello_deadline()};
  CoordinatorLink::Events events{
      .join = [this] { return JoinFrames(); },
      .joined = [this](const wire::JoinReply& reply) { OnLinkJoined(reply); },
      .checkpoint = [this](std::span<const uint8_t> frame) { events_.checkpoint(frame); },
      // This task's end may have waited for the coordinator's, and whoever
      // waits for its stop waits no more.
      .coordinator_stops = [this] { events_.coordinator_stopped(); },
      .acked =
          [this](uint64_t request_id) {
            if (request_id == ByeRound::kRequestId) lent_.bye->Answered(link_->endpoint());
          },
      .closed =
          [this] {
            events_.coordinator_stopped();
            if (!stopping_) events_.link_closed();
          },
  };
  return std::make_unique<CoordinatorLink>(*lent_.ctx, std::move(o), std::move(events));
}

std::vector<MessageBytes> CoordinatorMembership::JoinFrames() {
  std::vector<wire::Join> joins(1);
  joins.back().more = true;  // the join's end follows them
  lent_.tables->AddToJoin(&joins);
  // The chunks, then the last sync steps reported (a restarted coordinator
  // counts the global step from them; one that lived ignores steps it
  // counted) and those counted while the link was down, then the join's
  // end: the coordinator answers workers once every ps task got that far,
  // so its global step is whole by then.
  std::vector<MessageBytes> frames;
  frames.reserve(joins.size() + 2);
  for (const auto& join : joins) frames.push_back(wire::Encode(join, 3));
  steps_->AppendJoinFrames(&frames);
  wire::Join end;
  end.sync_step = lent_.tables->SyncStepReached();
  frames.push_back(wire::Encode(end, 3));
  return frames;
}

void CoordinatorMembership::OnLinkJoined(const wire::JoinReply& reply) {
  steps_->Flush();  // what was counted since the join went
  if (joined_) {
    TLOG_INFO("rejoined the coordinator");
    return;
  }
  TLOG_INFO("joined the coordinator (global step {})", reply.global_step);
  joined_ = true;
  events_.first_joined(reply);
}

void CoordinatorMembership::OnHostedJoined(const wire::JoinReply& reply) {
  if (stopping_ || joined_) return;
  joined_ = true;
  events_.first_joined(reply);
}

bool CoordinatorMembership::OnLinkFrame(const transport::Endpoint* ep,
                                        std::span<const uint8_t> frame) {
  if (!link_ || !link_->carries(ep)) return false;
  link_->OnFrame(frame);
  return true;
}

bool CoordinatorMembership::OnLinkClosed(const transport::Endpoint* ep, const Status& why) {
  if (!link_ || !link_->carries(ep)) return false;
  link_->OnClosed(why);
  return true;
}

void CoordinatorMembership::SayBye() {
  if (!link_ || link_->endpoint() == nullptr || !joined_) return;
  link_->Send(wire::Encode(wire::Bye{}, ByeRound::kRequestId));
  lent_.bye->Await(link_->endpoint());
}

bool CoordinatorMembership::coordinator_gone() const {
  return !link_ || link_->coordinator_said_bye() || !link_->joined();
}

void CoordinatorMembership::Stop() {
  stopping_ = true;
  steps_->Stop();
  if (link_) link_->Stop();
}

}  // namespace tessera::server
