// Who may try to authenticate to a ps or coordinator task, and for how long.
//
// A connection that has not proved it knows the cluster secret costs the
// task a socket and some memory, and each failed proof is a guess at the
// secret. Before its proof nothing tells a worker from an attacker on the
// same address, so nothing a neighbour did is held against a connection
// from a cluster host: it is never refused, and is pushed out only by the
// cluster's own connections. Everyone else (a stranger: an address that is
// no task's in the spec and never proved itself here) shares a part of the
// table and one budget of failed proofs, however many addresses it uses.
//
// So:
// - at most `max_unauthenticated` connections wait to authenticate, of them
//   at most `max_strangers` strangers. When full, the one to go is the
//   oldest stranger, then the oldest connection that has not said hello,
//   then the oldest: a handshake in progress outlives silent ones;
// - each must authenticate within `hello_deadline`;
// - strangers' failed proofs, all together, spend a token bucket
//   (`stranger_burst`, then one per `stranger_refill`); each waiting
//   stranger holds a token, given back unless its proof fails; while none
//   is left, strangers are refused at once. That bounds their guesses per
//   second, whatever addresses they use.
//   Failed proofs from cluster hosts are counted, and bounded only by the
//   table and the secret's strength (docs/security.md).
//
// Pure bookkeeping, with the time passed in, so that it is tested without
// sockets or sleeps.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tessera/status.h"

namespace tessera::server {

struct AdmissionOptions {
  size_t max_unauthenticated = 256;
  size_t max_strangers = 64;
  std::chrono::milliseconds hello_deadline{5000};
  int stranger_burst = 100;
  std::chrono::milliseconds stranger_refill{10};
  // Addresses remembered for having proved themselves (readers outside the
  // spec), the longest unseen forgotten first.
  size_t max_proven_hosts = 4096;
};

class Admission {
 public:
  using Clock = std::chrono::steady_clock;
  using ConnId = uint64_t;

  explicit Admission(AdmissionOptions options);

  // An address of a task in the cluster spec (numeric, as HostOfPeer gives).
  void AddClusterHost(const std::string& host);

  struct Decision {
    Status admitted;                // not OK: close the new connection, with this
    std::optional<ConnId> evicted;  // close this older one to make room
    // Whether the one closed is owed a reason: a cluster host's connection
    // whose handshake was under way (a worker, maybe, that will try again).
    // The others are cut off without one, which costs the task least.
    bool tell_evicted = false;
  };
  Decision Admit(ConnId conn, const std::string& host, Clock::time_point now);
  // The connection said hello and was challenged: its handshake is under way.
  void NoteHello(ConnId conn);
  // The connection proved itself: it no longer counts, and its host is no
  // stranger from now on.
  void NoteProven(ConnId conn, const std::string& host);
  // The connection closed: it no longer counts.
  void Forget(ConnId conn);
  // The connection's proof failed: it no longer counts, and a stranger's
  // guess is spent.
  void NoteFailure(ConnId conn);
  // Connections still unauthenticated past their deadline.
  std::vector<ConnId> Overdue(Clock::time_point now) const;

  bool IsStranger(const std::string& host) const;
  size_t unauthenticated() const { return index_.size(); }
  size_t strangers() const {
    return lists_[kStrangerSilent].size() + lists_[kStrangerHello].size();
  }
  uint64_t stranger_failures() const { return stranger_failures_; }
  uint64_t cluster_host_failures() const { return cluster_host_failures_; }
  const AdmissionOptions& options() const { return options_; }

 private:
  // Waiting connections by class and stage; each list oldest first, in the
  // order the eviction takes them.
  enum ListId { kStrangerSilent, kStrangerHello, kClusterSilent, kClusterHello, kLists };
  struct Pending {
    ConnId conn;
    Clock::time_point since;
  };
  struct Where {
    ListId list;
    std::list<Pending>::iterator it;
  };
  ConnId OldestOf(std::initializer_list<ListId> order) const;
  // Out of the table; whether it was a stranger's.
  bool Remove(ConnId conn);
  double StrangerTokens(Clock::time_point now) const;

  AdmissionOptions options_;
  std::array<std::list<Pending>, kLists> lists_;
  std::unordered_map<ConnId, Where> index_;
  std::unordered_set<std::string> cluster_hosts_;
  std::unordered_map<std::string, uint64_t> proven_hosts_;  // host -> when last proven (a count)
  uint64_t proofs_ = 0;
  double stranger_tokens_;
  Clock::time_point stranger_updated_{};
  uint64_t stranger_failures_ = 0;
  uint64_t cluster_host_failures_ = 0;
};

// "10.0.0.1" of "10.0.0.1:7000", "::1" of "[::1]:7000".
std::string HostOfPeer(const std::string& peer);

}  // namespace tessera::server
