#include "server/admission.h"

#include <algorithm>

namespace tessera::server {

Admission::Admission(AdmissionOptions options)
    : options_(options), stranger_tokens_(options.stranger_burst) {}

void Admission::AddClusterHost(const std::string& host) { cluster_hosts_.insert(host); }

bool Admission::IsStranger(const std::string& host) const {
  return !cluster_hosts_.contains(host) && !proven_hosts_.contains(host);
}

double Admission::StrangerTokens(Clock::time_point now) const {
  const double refilled = std::chrono::duration<double>(now - stranger_updated_) /
                          std::chrono::duration<double>(options_.stranger_refill);
  return std::min<double>(options_.stranger_burst, stranger_tokens_ + std::max(0.0, refilled));
}

Admission::ConnId Admission::OldestOf(std::initializer_list<ListId> order) const {
  for (ListId id : order) {
    if (!lists_[id].empty()) return lists_[id].front().conn;
  }
  return 0;
}

Admission::Decision Admission::Admit(ConnId conn, const std::string& host, Clock::time_point now) {
  Decision d;
  const bool stranger = IsStranger(host);
  std::optional<ConnId> out;
  if (stranger) {
    if (const double tokens = StrangerTokens(now); tokens < 1.0) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
          options_.stranger_refill * (1.0 - tokens));
      // ResourceExhausted: a client told so tries again later (shard_joiner.cc).
      d.admitted = Status::ResourceExhausted(
          "too many failed authentications from addresses outside the cluster spec lately; " +
          host + " is refused for another " + std::to_string(std::max<int64_t>(1, wait.count())) +
          " ms (is this task started with the cluster's secret?)");
      return d;
    }
    if (strangers() >= options_.max_strangers || index_.size() >= options_.max_unauthenticated) {
      // A stranger makes room among strangers only.
      if (strangers() == 0) {
        d.admitted = Status::ResourceExhausted(
            "too many connections from the cluster's hosts are waiting to authenticate");
        return d;
      }
      out = OldestOf({kStrangerSilent, kStrangerHello});
    }
  } else if (index_.size() >= options_.max_unauthenticated) {
    out = OldestOf({kStrangerSilent, kStrangerHello, kClusterSilent, kClusterHello});
  }
  if (out) {
    d.tell_evicted = index_.at(*out).list == kClusterHello;
    Forget(*out);
    d.evicted = out;
  }
  // A stranger holds a guess from the budget while it waits: it is spent
  // if its proof fails and given back otherwise, so that strangers admitted
  // together cannot guess more than the budget between them.
  if (stranger) {
    stranger_tokens_ = StrangerTokens(now) - 1.0;
    stranger_updated_ = now;
  }
  auto& list = lists_[stranger ? kStrangerSilent : kClusterSilent];
  list.push_back({conn, now});
  index_[conn] = Where{stranger ? kStrangerSilent : kClusterSilent, std::prev(list.end())};
  return d;
}

void Admission::NoteHello(ConnId conn) {
  auto it = index_.find(conn);
  if (it == index_.end()) return;
  Where& w = it->second;
  const ListId to = w.list == kStrangerSilent  ? kStrangerHello
                    : w.list == kClusterSilent ? kClusterHello
                                               : w.list;
  if (to == w.list) return;
  // Appended: a handshake is pushed out after every silent connection, and
  // after every handshake that began before it.
  lists_[to].splice(lists_[to].end(), lists_[w.list], w.it);
  w.list = to;
}

void Admission::NoteProven(ConnId conn, const std::string& host) {
  Forget(conn);
  if (cluster_hosts_.contains(host)) return;
  proven_hosts_[host] = ++proofs_;
  if (proven_hosts_.size() <= options_.max_proven_hosts) return;
  auto oldest = std::min_element(proven_hosts_.begin(), proven_hosts_.end(),
                                 [](auto& a, auto& b) { return a.second < b.second; });
  proven_hosts_.erase(oldest);
}

bool Admission::Remove(ConnId conn) {
  auto it = index_.find(conn);
  if (it == index_.end()) return false;
  const bool stranger = it->second.list == kStrangerSilent || it->second.list == kStrangerHello;
  lists_[it->second.list].erase(it->second.it);
  index_.erase(it);
  return stranger;
}

void Admission::Forget(ConnId conn) {
  if (Remove(conn)) {
    stranger_tokens_ = std::min<double>(options_.stranger_burst, stranger_tokens_ + 1.0);
  }
}

void Admission::NoteFailure(ConnId conn) {
  if (Remove(conn)) {
    stranger_failures_++;  // the guess it held is spent
  } else {
    cluster_host_failures_++;
  }
}

std::vector<Admission::ConnId> Admission::Overdue(Clock::time_point now) const {
  std::vector<ConnId> out;
  for (const auto& list : lists_) {
    for (const auto& p : list) {
      if (now - p.since >= options_.hello_deadline) out.push_back(p.conn);
    }
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
