// The links' requests and replies, a lost shard, and closing every link.

#include "client/shard_links.h"

#include "core/log.h"

namespace tessera::client {

ShardLinks::ShardLinks(transport::Context& ctx, std::vector<ShardLink> links, int coordinator_index,
                       CallCounters& counts)
    : ctx_(ctx), links_(std::move(links)), coordinator_index_(coordinator_index), counts_(counts) {}

void ShardLinks::Bind(int shard, std::shared_ptr<transport::Endpoint> ep) {
  ShardLink& s = links_[shard];
  if (s.ep) shard_of_.erase(s.ep.get());
  s.ep = std::move(ep);
  shard_of_[s.ep.get()] = shard;
}

void ShardLinks::Unbind(int shard) {
  ShardLink& s = links_[shard];
  if (!s.ep) return;
  shard_of_.erase(s.ep.get());
  s.ep->Abort();
  s.ep.reset();
}

void ShardLinks::OnFrame(const std::shared_ptr<transport::Endpoint>& ep,
                         std::span<const uint8_t> frame) {
  auto sit = shard_of_.find(ep.get());
  if (sit == shard_of_.end()) return;
  const int shard = sit->second;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) {
    TLOG_WARN("bad message from {}: {}", links_[shard].name(), h.status().ToString());
    return Lost(shard, h.status().WithContext("bad message"));
  }
  ReplyFn fn;
  if (!pending_.Take(h->request_id, &fn)) return OnUnclaimed(shard, ep, *h, frame);
  if (h->opcode == wire::Opcode::kError) {
    auto err = wire::DecodeBody<wire::Error>(*h, frame);
    return fn(err.ok() ? err->ToStatus() : err.status(), *h, frame);
  }
  fn(Status::Ok(), *h, frame);
}

void ShardLinks::OnUnclaimed(int shard, const std::shared_ptr<transport::Endpoint>& ep,
                             const wire::Header& h, std::span<const uint8_t> frame) {
  if (h.opcode == wire::Opcode::kPullReply) {
    // Nobody waits for it any more (the caller gave up): hand the lease back.
    auto reply = wire::DecodeBody<wire::PullReply>(h, frame);
    if (reply.ok()) ep->Send(wire::kProtocolMsg, wire::Encode(wire::Release{reply->lease_id}, 0));
    return;
  }
  if (h.opcode != wire::Opcode::kError) return;
  auto err = wire::DecodeBody<wire::Error>(h, frame);
  // A refusal the shard sent on accepting the connection, before it read
  // the hello (request 0), answers the handshake under way.
  ShardLink& link = links_[shard];
  ReplyFn fn;
  if (h.request_id == 0 && link.joining.request != 0 && pending_.Take(link.joining.request, &fn)) {
    return fn(err.ok() ? err->ToStatus() : err.status(), h, frame);
  }
  TLOG_WARN("{}: {}", link.name(), err.ok() ? err->message : "malformed error");
}

void ShardLinks::OnDisconnect(const std::shared_ptr<transport::Endpoint>& ep, const Status& why) {
  auto it = shard_of_.find(ep.get());
  if (it != shard_of_.end()) Lost(it->second, why);
}

void ShardLinks::Lost(int shard, const Status& why) {
  ShardLink& s = links_[shard];
  if (!s.dead.ok()) return;
  if (shard == coordinator_index_) coordinator_.Note(false);
  s.dead = Status::Unavailable(s.name() + " is gone: " + why.message());
  if (!stopping_) TLOG_ERROR("{}", s.dead.message());
  // Forced: a hung peer would never let a graceful close finish, and the
  // abort fails the one-sided operations still in flight.
  if (s.ep) s.ep->Abort();
  FailCallsOf(shard, s.dead);
}

void ShardLinks::FailCallsOf(int shard, const Status& why) {
  ShardLink& s = links_[shard];
  std::vector<ReplyFn> fail;
  pending_.TakeAllOf(shard, &fail);
  for (auto& fn : fail) fn(why, wire::Header{}, {});
  auto in_flight = std::move(s.in_flight.ops);
  s.in_flight.ops.clear();
  for (auto& [id, abort] : in_flight) abort(why);
  auto waiting = std::move(s.waiting_for_staging);
  for (auto& fn : waiting) fn();
}

void ShardLinks::SayBye() {
  // Bounded: a shard that does not answer is closed on anyway.
  constexpr auto kByeWait = std::chrono::seconds(2);
  auto answered = std::make_shared<std::promise<void>>();
  auto remaining = std::make_shared<size_t>(0);
  ctx_.Post([this, answered, remaining] {
    for (size_t s = 0; s < links_.size(); ++s) {
      // Only to a shard this worker proved itself to: to any other a bye
      // is a protocol breach.
      if (!links_[s].ep || !links_[s].dead.ok() || !links_[s].ep->authenticated()) continue;
      ++*remaining;
      Request(static_cast<int>(s), wire::Bye{}, 0,
              [answered, remaining](const Status&, const wire::Header&, std::span<const uint8_t>) {
                if (--*remaining == 0) answered->set_value();
              });
    }
    if (*remaining == 0) answered->set_value();
  });
  answered->get_future().wait_for(kByeWait);
}

void ShardLinks::CloseAll(const std::function<void(int shard, const Status& why)>& also_fail) {
  stopping_ = true;
  for (auto& s : links_) {
    if (s.ep && s.in_flight.ops.empty()) s.ep->Close();
    if (s.ep && !s.in_flight.ops.empty()) s.ep->Abort();
  }
  // Calls still running fail now, rather than leave their futures (which
  // may outlive the client, e.g. through the C API) waiting out the
  // operation timeout.
  for (size_t shard = 0; shard < links_.size(); ++shard) {
    ShardLink& s = links_[shard];
    if (s.dead.ok())
      s.dead = Status::Aborted("the client was destroyed before this call completed");
    FailCallsOf(static_cast<int>(shard), s.dead);
    also_fail(static_cast<int>(shard), s.dead);
  }
  pending_.Clear();
  // Remote regions must go before the context.
  for (auto& s : links_) {
    s.DropRegions(counts_);
    s.gather.Release();
  }
}

}  // namespace tessera::client
