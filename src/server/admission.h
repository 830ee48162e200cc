// Who may try to authenticate to a ps or coordinator task, and for how long.
//
// A connection that has not proved it knows the cluster secret costs the
// task a socket and some memory, and each failed proof is a guess at the
// secret. So: at most `max_unauthenticated` such connections at once (a new
// one pushes out the oldest, which has had the longest to say hello); each
// must authenticate within `hello_deadline`; and a host whose proofs keep
// failing is refused for a while (a token bucket per host: `burst` failures,
// then one more per `refill`). Pure bookkeeping, with the time passed in, so
// that it is tested without sockets or sleeps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/status.h"

namespace tessera::server {

struct AdmissionOptions {
  size_t max_unauthenticated = 64;
  std::chrono::milliseconds hello_deadline{5000};
  int burst = 10;
  std::chrono::milliseconds refill{1000};
  size_t max_tracked_hosts = 4096;
};

class Admission {
 public:
  using Clock = std::chrono::steady_clock;
  using ConnId = uint64_t;

  explicit Admission(AdmissionOptions options) : options_(options) {}

  struct Decision {
    Status admitted;                // not OK: close the new connection, with this
    std::optional<ConnId> evicted;  // close this older one to make room
  };
  Decision Admit(ConnId conn, const std::string& host, Clock::time_point now);
  // The connection authenticated, or closed: it no longer counts.
  void Forget(ConnId conn);
  // A proof from `host` failed.
  void NoteFailure(const std::string& host, Clock::time_point now);
  // Connections still unauthenticated past their deadline, oldest first.
  std::vector<ConnId> Overdue(Clock::time_point now) const;

  size_t unauthenticated() const { return pending_.size(); }
  const AdmissionOptions& options() const { return options_; }

 private:
  struct Bucket {
    double tokens;
    Clock::time_point updated;
  };
  struct Pending {
    ConnId conn;
    Clock::time_point since;
  };
  // Failures `host` may still have now, refills included.
  double TokensLeft(const std::string& host, Clock::time_point now) const;
  void TrimHosts(Clock::time_point now);

  AdmissionOptions options_;
  std::list<Pending> pending_;  // oldest first
  std::unordered_map<ConnId, std::list<Pending>::iterator> pending_index_;
  std::unordered_map<std::string, Bucket> failures_;
};

// "10.0.0.1" of "10.0.0.1:7000", "::1" of "[::1]:7000".
std::string HostOfPeer(const std::string& peer);

}  // namespace tessera::server
