// Parts of calls retried over a ps task's restart in place
// (ClientOptions::retry_lost_shard_within): a part that failed because its
// shard was lost waits, in the shard's connection, until the shard is back
// and this worker's tensors are created on it again (ReCreate), then is
// issued as it was first; once its bound passes it fails with the loss.

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "client/client_impl.h"

namespace tessera {

struct Client::Impl::RetriedPart {
  int shard = 0;
  // The part as first issued. Its chunks are read again when it is issued
  // again: ReCreate updates their keys and arenas in place.
  ChunkIos ios;
  std::shared_ptr<Future::State> op;
  IssueFn issue;
  // Set when the shard was first lost under it: the part fails once this
  // passes, however often the shard comes and goes meanwhile.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  Status lost;  // why, the first time
};

Status Client::Impl::CheckRetryBound() {
  auto& bound = options_.retry_lost_shard_within;
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
  if (bound > options_.op_timeout) {
    // Every wait ends at op_timeout: a longer bound would only keep a part
    // going after its caller was told it timed out.
    return Status::InvalidArgument(
        "retry_lost_shard_within (" + std::to_string(bound.count()) + " ms) exceeds op_timeout (" +
        std::to_string(options_.op_timeout.count()) + " ms), which bounds every wait");
  }
  return Status::Ok();
}

std::shared_ptr<Client::Impl::RetriedPart> Client::Impl::NewRetriedPart(
    int shard, ChunkIos ios, std::shared_ptr<Future::State> op, IssueFn issue) {
  auto part = std::make_shared<RetriedPart>();
  part->shard = shard;
  part->ios = std::move(ios);
  part->op = std::move(op);
  part->issue = std::move(issue);
  return part;
}

void Client::Impl::IssueRetried(const std::shared_ptr<RetriedPart>& part) {
  part->issue(part->ios, [this, part](const Status& st) { OnRetriedPartDone(part, st); });
}

void Client::Impl::OnRetriedPartDone(const std::shared_ptr<RetriedPart>& part, const Status& st) {
  ShardConn& s = shards_[part->shard];
  // Only a loss of the shard is waited out: the shard's own refusals, and
  // anything once the client closes, are the call's outcome.
  const bool lost = st.code() == StatusCode::kUnavailable && !s.dead.ok();
  if (st.ok() || !lost || stopping_) return part->op->Finish(st);
  const auto now = std::chrono::steady_clock::now();
  if (!part->deadline) {
    part->deadline = now + options_.retry_lost_shard_within;
    part->lost = st;
  }
  if (now >= *part->deadline) {
    return part->op->Finish(
        st.WithContext("not back within retry_lost_shard_within (" +
                       std::to_string(options_.retry_lost_shard_within.count()) +
                       " ms; lost first: " + part->lost.message() + ")"));
  }
  s.parked.parts.push_back(part);
  Reconnect(part->shard);
  SweepParked(part->shard);
}

void Client::Impl::ReissueParked(int shard) {
  auto parked = std::move(shards_[shard].parked.parts);
  shards_[shard].parked.parts.clear();
  if (!parked.empty()) {
    TLOG_INFO("{}: {} call part(s) that failed when it was lost are issued again",
              shards_[shard].name(), parked.size());
  }
  for (const auto& part : parked) IssueRetried(part);
}

void Client::Impl::SweepParked(int shard) {
  ShardConn& s = shards_[shard];
  if (s.parked.sweep_scheduled || stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  std::deque<std::shared_ptr<RetriedPart>> waiting;
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (auto& part : s.parked.parts) {
    if (now < *part->deadline) {
      earliest = std::min(earliest.value_or(*part->deadline), *part->deadline);
      waiting.push_back(std::move(part));
      continue;
    }
    part->op->Finish(
        part->lost.WithContext("not back within retry_lost_shard_within (" +
                               std::to_string(options_.retry_lost_shard_within.count()) + " ms)"));
  }
  s.parked.parts = std::move(waiting);
  if (!earliest) return;
  // Heartbeats try a lost shard again each interval; without them nothing
  // else would while the calls only wait. Reconnect paces its own attempts.
  Reconnect(shard);
  s.parked.sweep_scheduled = true;
  const auto until = std::chrono::duration_cast<std::chrono::milliseconds>(*earliest - now);
  ctx_->PostAfter(std::clamp(until, std::chrono::milliseconds(1), std::chrono::milliseconds(500)),
                  [this, shard] {
                    shards_[shard].parked.sweep_scheduled = false;
                    SweepParked(shard);
                  });
}

void Client::Impl::FailParked(int shard, const Status& why) {
  auto parked = std::move(shards_[shard].parked.parts);
  shards_[shard].parked.parts.clear();
  for (const auto& part : parked) part->op->Finish(why);
}

}  // namespace tessera
