#include "server/admission.h"

#include <algorithm>
#include <cmath>

namespace tessera::server {

double Admission::TokensLeft(const std::string& host, Clock::time_point now) const {
  auto it = failures_.find(host);
  if (it == failures_.end()) return options_.burst;
  const Bucket& b = it->second;
  const double refilled = std::chrono::duration<double>(now - b.updated) /
                          std::chrono::duration<double>(options_.refill);
  return std::min<double>(options_.burst, b.tokens + std::max(0.0, refilled));
}

Admission::Decision Admission::Admit(ConnId conn, const std::string& host, Clock::time_point now) {
  Decision d;
  if (const double tokens = TokensLeft(host, now); tokens < 1.0) {
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.refill * (1.0 - tokens));
    // ResourceExhausted: a worker told so tries again later (shard_link.cc).
    d.admitted = Status::ResourceExhausted("too many failed authentications from " + host +
                                           " lately; refused for another " +
                                           std::to_string(std::max<int64_t>(1, wait.count())) +
                                           " ms (is this task started with the cluster's secret?)");
    return d;
  }
  if (pending_.size() >= options_.max_unauthenticated && !pending_.empty()) {
    d.evicted = pending_.front().conn;
    Forget(pending_.front().conn);
  }
  pending_.push_back({conn, now});
  pending_index_[conn] = std::prev(pending_.end());
  return d;
}

void Admission::Forget(ConnId conn) {
  auto it = pending_index_.find(conn);
  if (it == pending_index_.end()) return;
  pending_.erase(it->second);
  pending_index_.erase(it);
}

void Admission::NoteFailure(const std::string& host, Clock::time_point now) {
  const double left = TokensLeft(host, now);
  failures_[host] = Bucket{std::max(0.0, left - 1.0), now};
  if (failures_.size() > options_.max_tracked_hosts) TrimHosts(now);
}

void Admission::TrimHosts(Clock::time_point now) {
  // Hosts whose bucket refilled carry no information; drop them first, then
  // the ones that failed longest ago.
  for (auto it = failures_.begin(); it != failures_.end();) {
    it = TokensLeft(it->first, now) >= options_.burst ? failures_.erase(it) : std::next(it);
  }
  while (failures_.size() > options_.max_tracked_hosts) {
    auto oldest = std::min_element(failures_.begin(), failures_.end(), [](auto& a, auto& b) {
      return a.second.updated < b.second.updated;
    });
    failures_.erase(oldest);
  }
}

std::vector<Admission::ConnId> Admission::Overdue(Clock::time_point now) const {
  std::vector<ConnId> out;
  for (const auto& p : pending_) {
    if (now - p.since < options_.hello_deadline) break;  // the rest are younger
    out.push_back(p.conn);
  }
  return out;
}

std::string HostOfPeer(const std::string& peer) {
  if (!peer.empty() && peer.front() == '[') {
    const auto close = peer.find(']');
    return close == std::string::npos ? peer : peer.substr(1, close - 1);
  }
  const auto colon = peer.rfind(':');
  if (colon == std::string::npos || peer.find(':') != colon) return peer;
  return peer.substr(0, colon);
}

}  // namespace tessera::server
