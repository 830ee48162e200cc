// Rank 0's side of the rendezvous: every rank's join read, checked and
// kept until all are in, then each answered with its assignment.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "rendezvous/frames.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/socket_io.h"

namespace tessera::rendezvous {
namespace {

// A connection before and after its join: what it sent so far, until when
// it may send it, and the nonce it was challenged with.
struct Pending {
  Socket socket;
  Nonce server_nonce{};
  std::vector<uint8_t> received;
  Clock::time_point deadline;
  std::string peer;
};

struct Joined {
  Socket socket;
  Nonce server_nonce{}, client_nonce{};
  Join join;
};

// "0-2, 5, 7-9": the ranks in `missing`.
std::string Ranges(const std::vector<int>& missing) {
  std::string out;
  for (size_t i = 0; i < missing.size();) {
    size_t j = i;
    while (j + 1 < missing.size() && missing[j + 1] == missing[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(missing[i]) +
           (j > i ? "-" + std::to_string(missing[j]) : "");
    i = j + 1;
  }
  return out;
}

// A connection has this long to send its join after it connected.
constexpr auto kJoinDeadline = std::chrono::seconds(10);

}  // namespace

Status RendezvousServer::Listen() {
  auto s = ListenOn(options_.port);
  if (!s.ok()) return s.status();
  listener_ = std::move(*s);
  return Status::Ok();
}

Status RendezvousServer::Serve() {
  if (!listener_.valid()) TESSERA_RETURN_IF_ERROR(Listen());
  const int world = options_.world_size;
  // Strangers cannot crowd out the ranks: at most this many connections
  // that have not joined yet; a new one closes the oldest.
  const size_t max_pending = static_cast<size_t>(world) + 16;
  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  auto next_report = start + options_.report_interval;
  std::vector<std::unique_ptr<Pending>> pending;
  std::map<int, Joined> joined;
  size_t refused = 0;

  auto refuse = [&](size_t i, const std::string& why) {
    if (refused++ < 20) {
      fprintf(stderr, "tessera run: rendezvous: refused a connection from %s: %s\n",
              pending[i]->peer.c_str(), why.c_str());
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  // Answers every rank that joined: its assignment, or `why` for all.
  auto answer_all = [&](const Result<std::vector<Assignment>>& assigned) {
    Status first;
    for (auto& [rank, j] : joined) {
      Result<Assignment> mine = assigned.ok() ? Result<Assignment>((*assigned)[rank])
                                              : Result<Assignment>(assigned.status());
      auto frame = EncodeAnswer(mine, secret_, j.client_nonce, j.server_nonce);
      Status st = WriteAllBefore(j.socket, frame, Clock::now() + std::chrono::seconds(10));
      if (!st.ok() && first.ok()) first = st.WithContext("answering rank " + std::to_string(rank));
    }
    return first;
  };

  while (static_cast<int>(joined.size()) < world) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < world; ++r) {
        if (!joined.count(r)) missing.push_back(r);
      }
      Status why = Status::DeadlineExceeded(
          "rank(s) " + Ranges(missing) + " of " + std::to_string(world) +
          " did not join the rendezvous within " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(options_.timeout).count()) +
          " s");
      (void)answer_all(why);
      return why;
    }
    if (now >= next_report) {
      std::vector<int> missing;
      for (int r = 0; r < world; ++r) {
        if (!joined.count(r)) missing.push_back(r);
      }
      fprintf(stderr, "tessera run: rendezvous: %zu of %d ranks joined; waiting for %s\n",
              joined.size(), world, Ranges(missing).c_str());
      next_report = now + options_.report_interval;
    }
    // Drop connections that did not join in time.
    for (size_t i = 0; i < pending.size();) {
      if (pending[i]->deadline <= now) {
        refuse(i, "no join within 10 s");
      } else {
        ++i;
      }
    }
    std::vector<pollfd> fds = {{listener_.fd(), POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p->socket.fd(), POLLIN, 0});
    // A rank that joined sends nothing more: readable means it went away
    // (it may join again, as a restarted task does).
    std::vector<int> joined_ranks;
    for (const auto& [rank, j] : joined) {
      fds.push_back({j.socket.fd(), POLLIN, 0});
      joined_ranks.push_back(rank);
    }
    const size_t pending_fds = pending.size();
    auto wake = std::min(deadline, next_report);
    for (const auto& p : pending) wake = std::min(wake, p->deadline);
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    if (poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait_ms, 1))) < 0 &&
        errno != EINTR) {
      return Status::Internal("poll failed in the rendezvous");
    }
    for (size_t k = 0; k < joined_ranks.size(); ++k) {
      if (!(fds[1 + pending_fds + k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      fprintf(stderr, "tessera run: rendezvous: rank %d left before the answer\n", joined_ranks[k]);
      joined.erase(joined_ranks[k]);
    }
    // Read what arrived; a complete join is checked, then kept.
    for (size_t k = 1, i = 0; k < 1 + pending_fds; ++k) {
      Pending& p = *pending[i];
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
        ++i;
        continue;
      }
      uint8_t buf[4096];
      const ssize_t n = recv(p.socket.fd(), buf, sizeof(buf), 0);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          ++i;
          continue;
        }
        refuse(i, "closed before its join");
        continue;
      }
      if (p.received.size() + static_cast<size_t>(n) > kMaxJoinBytes) {
        refuse(i, "more than " + std::to_string(kMaxJoinBytes) + " bytes");
        continue;
      }
      p.received.insert(p.received.end(), buf, buf + n);
      Nonce client_nonce{};
      auto decoded = DecodeJoin(p.received, secret_, p.server_nonce, &client_nonce);
      if (!decoded.ok()) {
        refuse(i, decoded.status().message());
        continue;
      }
      if (!decoded->has_value()) {
        ++i;
        continue;
      }
      Join join = std::move(**decoded);
      std::string wrong;
      if (join.world_size != world) {
        wrong = "says the job has " + std::to_string(join.world_size) + " ranks, rank 0 says " +
                std::to_string(world);
      } else if (join.rank < 0 || join.rank >= world) {
        wrong = "says it is rank " + std::to_string(join.rank);
      } else if (joined.count(join.rank)) {
        wrong = "joins as rank " + std::to_string(join.rank) + ", which joined already";
      }
      if (!wrong.empty()) {
        refuse(i, "a join that " + wrong);
        continue;
      }
      if (join.host.empty()) join.host = p.peer;
      joined[join.rank] =
          Joined{std::move(p.socket), p.server_nonce, client_nonce, std::move(join)};
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // New connections last: `fds` matched `pending` until here.
    if (fds[0].revents & POLLIN) {
      while (true) {
        Socket s(accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!s.valid()) break;
        if (pending.size() >= max_pending) refuse(0, "too many connections that have not joined");
        auto p = std::make_unique<Pending>();
        p->server_nonce = RandomNonce();
        p->deadline = Clock::now() + kJoinDeadline;
        p->peer = PeerHost(s);
        p->socket = std::move(s);
        if (WriteAllBefore(p->socket, p->server_nonce, Clock::now() + std::chrono::seconds(1))
                .ok()) {
          pending.push_back(std::move(p));
        }
      }
    }
  }
  std::vector<Join> joins;
  for (auto& [rank, j] : joined) joins.push_back(j.join);
  auto assigned = AssignRoles(joins, options_.policy);
  Status sent = answer_all(assigned);
  if (!assigned.ok()) return assigned.status();
  return sent;
}

}  // namespace tessera::rendezvous
