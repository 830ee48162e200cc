#include "client/lost_shard_retry.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "core/log.h"

namespace tessera::client {

struct LostShardRetry::Part {
  int shard = 0;
  std::shared_ptr<Future::State> op;
  // The part as first issued. Its chunks are read again when it is issued
  // again: the client's re-create updates their keys and arenas in place.
  Issue issue;
  // Set when the shard was first lost under it: the part fails once this
  // passes, however often the shard comes and goes meanwhile.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  Status lost;  // why, the first time
};

LostShardRetry::LostShardRetry(transport::Context& ctx, std::chrono::milliseconds bound,
                               size_t num_shards, Shards shards)
    : ctx_(ctx), bound_(bound), shards_(std::move(shards)), held_(num_shards) {}

Status LostShardRetry::TakeBound(ClientOptions* options) {
  auto& bound = options->retry_lost_shard_within;
  if (const char* text = std::getenv("TESSERA_RETRY_LOST_SHARD_MS"); text && *text) {
    char* end = nullptr;
    errno = 0;
    const long long ms = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || ms < 0) {
      return Status::InvalidArgument(std::string("TESSERA_RETRY_LOST_SHARD_MS='") + text +
                                     "': expected milliseconds, 0 or more");
    }
    bound = std::chrono::milliseconds(ms);
  }
  if (bound.count() < 0) {
    return Status::InvalidArgument("retry_lost_shard_within is " + std::to_string(bound.count()) +
                                   " ms: expected 0 (off) or more");
  }
  if (bound > options->op_timeout) {
    // Every wait ends at op_timeout: a longer bound would only keep a part
    // going after its caller was told it timed out.
    return Status::InvalidArgument(
        "retry_lost_shard_within (" + std::to_string(bound.count()) + " ms) exceeds op_timeout (" +
        std::to_string(options->op_timeout.count()) + " ms), which bounds every wait");
  }
  return Status::Ok();
}

void LostShardRetry::IssuePart(int shard, std::shared_ptr<Future::State> op, Issue issue) {
  auto part = std::make_shared<Part>();
  part->shard = shard;
  part->op = std::move(op);
  part->issue = std::move(issue);
  IssueAgain(part);
}

void LostShardRetry::IssueAgain(const std::shared_ptr<Part>& part) {
  part->issue(PartDone([this, part](const Status& st) { OnDone(part, st); }));
}

std::string LostShardRetry::BoundPassed() const {
  return "not back within retry_lost_shard_within (" + std::to_string(bound_.count()) + " ms";
}

void LostShardRetry::OnDone(const std::shared_ptr<Part>& part, const Status& st) {
  // Only a loss of the shard is waited out: the shard's own refusals, and
  // anything once the client closes, are the call's outcome.
  const bool lost = st.code() == StatusCode::kUnavailable && shards_.lost(part->shard);
  if (st.ok() || !lost || stopping_) return part->op->Finish(st);
  const auto now = std::chrono::steady_clock::now();
  if (!part->deadline) {
    part->deadline = now + bound_;
    part->lost = st;
  }
  if (now >= *part->deadline) {
    return part->op->Finish(
        st.WithContext(BoundPassed() + "; lost first: " + part->lost.message() + ")"));
  }
  held_[part->shard].parts.push_back(part);
  shards_.reconnect(part->shard);
  Sweep(part->shard);
}

void LostShardRetry::ShardBack(int shard) {
  auto held = std::move(held_[shard].parts);
  held_[shard].parts.clear();
  if (!held.empty()) {
    TLOG_INFO("{}: {} call part(s) that failed when it was lost are issued again",
              shards_.name(shard), held.size());
  }
  for (const auto& part : held) IssueAgain(part);
}

void LostShardRetry::Sweep(int shard) {
  Held& h = held_[shard];
  if (h.sweep_scheduled || stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  std::deque<std::shared_ptr<Part>> waiting;
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (auto& part : h.parts) {
    if (now < *part->deadline) {
      earliest = std::min(earliest.value_or(*part->deadline), *part->deadline);
      waiting.push_back(std::move(part));
      continue;
    }
    part->op->Finish(part->lost.WithContext(BoundPassed() + ")"));
  }
  h.parts = std::move(waiting);
  if (!earliest) return;
  // Heartbeats try a lost shard again each interval; without them nothing
  // else would while the calls only wait. The client paces its attempts.
  shards_.reconnect(shard);
  h.sweep_scheduled = true;
  const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(*earliest - now);
  ctx_.PostAfter(std::clamp(until, std::chrono::milliseconds(1), std::chrono::milliseconds(500)),
                 [this, shard] {
                   held_[shard].sweep_scheduled = false;
                   Sweep(shard);
                 });
}

void LostShardRetry::FailHeld(int shard, const Status& why) {
  auto held = std::move(held_[shard].parts);
  held_[shard].parts.clear();
  for (const auto& part : held) part->op->Finish(why);
}

}  // namespace tessera::client
