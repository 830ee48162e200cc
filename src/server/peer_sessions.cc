#include "server/peer_sessions.h"

#include <sys/resource.h>

#include <algorithm>
#include <set>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/log.h"
#include "core/timeouts.h"
#include "transport/sockaddr.h"

namespace tessera::server {
namespace {

// Connections accepted after which the end of a flood gives memory back.
constexpr uint64_t kFloodConnections = 1024;

void TrimHeap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace

void PeerSessions::OnHandshakeFrame(Peer& peer, const wire::Header& h,
                                    std::span<const uint8_t> frame) {
  Status st;
  if (h.opcode == wire::Opcode::kHello && !peer.handshake.said_hello()) {
    st = OnHello(peer, h, frame);
  } else if (h.opcode == wire::Opcode::kAuth && peer.handshake.said_hello()) {
    st = OnAuth(peer, h, frame);
  } else {
    st = Status::PermissionDenied(std::string(wire::OpcodeName(h.opcode)) +
                                  " before authentication");
  }
  if (!st.ok()) Drop(peer, st, h.request_id);
}

std::string PeerSessions::Self() const {
  return server().job + " task " + std::to_string(server().task_index);
}

MessageBytes PeerSessions::ErrorFrame(const Status& st, uint64_t request_id) const {
  return wire::Encode(wire::Error{st.code(), Self() + ": " + st.message()}, request_id);
}

void PeerSessions::SendError(Peer& peer, uint64_t request_id, const Status& st) {
  peer.ep->Send(wire::kProtocolMsg, ErrorFrame(st, request_id));
}

void PeerSessions::Drop(Peer& peer, const Status& why, uint64_t request_id, bool tell) {
  refused_++;
  uint64_t held_back = 0;
  // A stranger can be refused as often as it connects: those lines are
  // throttled (the count of refusals is in the status counters).
  if (peer.authenticated || refusal_log_.Allow(LogThrottle::Clock::now(), &held_back)) {
    TLOG_WARN("closing connection from {} ({}): {}{}", peer.ep->peer(),
              peer.hello.task.empty() ? "unauthenticated" : peer.hello.task, why.ToString(),
              held_back == 0 ? ""
                             : " (and " + std::to_string(held_back) +
                                   " more unauthenticated connections closed, not logged)");
  }
  auto ep = peer.ep;
  const bool unproven = !peer.authenticated;
  events_.ended(ep, why);  // nothing more it sends is read
  // An unproven peer gets no graceful close: that would hold its socket
  // and buffers for the linger, which a flood turns into descriptors run out.
  if (!tell) return unproven ? ep->Abort() : ep->Close();
  // Tell the peer why, and leave the closing to it: a close from here can
  // overtake the reason (UCX reports a disconnect over tcp while the message
  // travels through shared memory). A peer that does not close is closed
  // after the hello deadline, or sooner when too many linger.
  ep->Send(wire::kProtocolMsg, ErrorFrame(why, request_id));
  closing_.push_back({ep, std::chrono::steady_clock::now() + admission_->options().hello_deadline});
  if (closing_.size() > admission_->options().max_unauthenticated) {
    closing_.front().first->Abort();  // told why already; the newest are kept
    closing_.pop_front();
  }
  ScheduleSweep(admission_->options().hello_deadline);
}

void PeerSessions::ScheduleSweep(std::chrono::milliseconds after) {
  if (overdue_sweep_scheduled_ || stopping_) return;
  overdue_sweep_scheduled_ = true;
  ctx_.PostAfter(after, [this] { DropOverdue(); });
}

void PeerSessions::Accept(const EndpointPtr& ep) {
  accepted_since_trim_++;
  auto owned = std::make_unique<Peer>(ep, server().secret, options_.reader_key);
  Peer& peer = *owned;
  peers_[ep.get()] = std::move(owned);
  const auto now = std::chrono::steady_clock::now();
  auto d = admission_->Admit(reinterpret_cast<uintptr_t>(ep.get()), HostOfPeer(ep->peer()), now);
  if (d.evicted) {
    auto it = peers_.find(reinterpret_cast<transport::Endpoint*>(*d.evicted));
    if (it != peers_.end()) {
      Drop(*it->second, Status::ResourceExhausted(
                            "did not authenticate, and the table of connections waiting to (" +
                            std::to_string(admission_->options().max_unauthenticated) +
                            ", of them " + std::to_string(admission_->options().max_strangers) +
                            " from outside the cluster's hosts) was full of newer ones"));
    }
  }
  if (!d.admitted.ok()) return Drop(peer, d.admitted);
  ScheduleSweep(admission_->options().hello_deadline);
}

void PeerSessions::DropOverdue() {
  overdue_sweep_scheduled_ = false;
  const auto now = std::chrono::steady_clock::now();
  while (!closing_.empty() && closing_.front().second <= now) {
    closing_.front().first->Abort();  // had the hello deadline to read why and close
    closing_.pop_front();
  }
  for (auto conn : admission_->Overdue(now)) {
    auto it = peers_.find(reinterpret_cast<transport::Endpoint*>(conn));
    if (it == peers_.end()) {
      admission_->Forget(conn);
      continue;
    }
    Drop(*it->second,
         Status::DeadlineExceeded("did not authenticate within " +
                                  std::to_string(admission_->options().hello_deadline.count()) +
                                  " ms"),
         0, /*tell=*/false);
  }
  if (admission_->unauthenticated() > 0 || !closing_.empty()) {
    ScheduleSweep(admission_->options().hello_deadline / 4);
  } else if (accepted_since_trim_ >= kFloodConnections) {
    // A flood ended: what its connections' buffers took from the heap goes
    // back to the system, not kept for the next one.
    accepted_since_trim_ = 0;
    TrimHeap();
  }
}

Status PeerSessions::OnHello(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  auto m = wire::DecodeBody<wire::Hello>(h, frame);
  if (!m.ok()) return m.status();
  // Nothing is checked against the cluster before the peer proved itself, so
  // that a stranger learns nothing of it; the challenge carries no proof.
  Reply(peer, h.request_id, peer.handshake.OnHello(std::move(*m), options_.hello_index));
  admission_->NoteHello(reinterpret_cast<uintptr_t>(peer.ep.get()));
  return Status::Ok();
}

Status PeerSessions::CheckClaims(const wire::Hello& m) const {
  if (m.task.empty()) return Status::InvalidArgument("hello without a task name");
  if (m.role == wire::PeerRole::kShard) {
    const int k = static_cast<int>(m.task_index);
    if (!options_.hosts_coordinator) {
      return Status::PermissionDenied(m.task + " tried to join a task that is not the coordinator");
    }
    if (k >= server().cluster.num_tasks("ps") || m.task != TaskId{"ps", k}.ToString()) {
      return Status::PermissionDenied(m.task + " joins as ps task " + std::to_string(k) +
                                      ", which the cluster spec does not name so");
    }
  } else if (m.role == wire::PeerRole::kObserver) {
    return Status::Ok();  // no rank, no spec: an observer counts for nothing
  } else if (m.role == wire::PeerRole::kReader) {
    // No rank either, and no name of the cluster's tasks (logs and status
    // name peers by it); it must only agree on where the tensors live.
    for (const char* job : {"ps", "worker", "chief", "coordinator"}) {
      if (m.task.starts_with(std::string("/job:") + job + "/")) {
        return Status::PermissionDenied("reader " + m.task +
                                        " takes the name of a task of the cluster; name it "
                                        "another job (e.g. /job:evaluator/task:0)");
      }
    }
    auto theirs = ClusterSpec::FromJson(m.cluster);
    if (!theirs.ok())
      return theirs.status().WithContext("the cluster spec in " + m.task + "'s hello");
    const std::string diff = server().cluster.DifferenceFrom(*theirs, /*workers_too=*/false);
    if (diff.empty()) return Status::Ok();
    return Status::FailedPrecondition(
        "the cluster spec of reader " + m.task + " (there) differs from that of " +
        TaskId{server().job, server().task_index}.ToString() + " (here): " + diff);
  } else if (static_cast<int>(m.task_index) >= server().cluster.num_workers()) {
    return Status::PermissionDenied(m.task + " claims worker rank " + std::to_string(m.task_index) +
                                    " but the cluster has " +
                                    std::to_string(server().cluster.num_workers()) + " workers");
  }
  auto theirs = ClusterSpec::FromJson(m.cluster);
  if (!theirs.ok())
    return theirs.status().WithContext("the cluster spec in " + m.task + "'s hello");
  const std::string diff = server().cluster.DifferenceFrom(*theirs);
  if (!diff.empty()) {
    return Status::FailedPrecondition(
        "the cluster spec of " + m.task + " (there) differs from that of " +
        TaskId{server().job, server().task_index}.ToString() + " (here): " + diff +
        ". Give every task the same cluster spec");
  }
  return Status::Ok();
}

Status PeerSessions::OnAuth(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  auto m = wire::DecodeBody<wire::Auth>(h, frame);
  if (!m.ok()) return m.status();
  const auto conn = reinterpret_cast<uintptr_t>(peer.ep.get());
  if (Status proof = peer.handshake.CheckAuth(*m, peer.ep->peer()); !proof.ok()) {
    admission_->NoteFailure(conn);
    return proof;
  }
  admission_->NoteProven(conn, HostOfPeer(peer.ep->peer()));
  TESSERA_RETURN_IF_ERROR(CheckClaims(peer.handshake.hello()));
  peer.hello = peer.handshake.hello();
  peer.ep->MarkAuthenticated();
  wire::Welcome welcome;
  welcome.protection = peer.handshake.DecideProtection(
      server().session_protection, peer.ep->CanProtectSession(), peer.ep->PeerOnLoopback());
  welcome.server_proof = peer.handshake.ServerProof();
  if (peer.hello.role != wire::PeerRole::kWorker) {
    // Readers, observers and shards write no tensors: a write key they got
    // hold of (a reader's captured staging key) lets them write nothing.
    peer.ep->MarkReadOnly();
  }
  if (peer.hello.role == wire::PeerRole::kObserver) {
    peer.authenticated = true;
    peer.is_observer = true;
    // No staging slot, no keys.
    return SendWelcome(peer, h.request_id, welcome);
  }
  if (peer.hello.role == wire::PeerRole::kReader) {
    peer.authenticated = true;
    peer.is_reader = true;
    TLOG_INFO("reader {} connected from {}", peer.hello.task, peer.ep->peer());
    // No staging slot: it writes nothing here.
    return SendWelcome(peer, h.request_id, welcome);
  }
  if (peer.hello.role == wire::PeerRole::kShard) {
    peer.authenticated = true;
    peer.is_shard = true;
    // No staging slot: shards write no tensors here.
    return SendWelcome(peer, h.request_id, welcome);
  }
  // A worker: what its role gives it (a shard's staging slot), and its
  // arrival counted.
  TESSERA_RETURN_IF_ERROR(events_.worker_joins(peer, &welcome));
  peer.authenticated = true;
  TLOG_INFO("{} connected from {}", peer.hello.task, peer.ep->peer());
  return SendWelcome(peer, h.request_id, welcome);
}

Status PeerSessions::SendWelcome(Peer& peer, uint64_t request_id, const wire::Welcome& welcome) {
  Reply(peer, request_id, welcome);
  if (!welcome.session_protected()) return Status::Ok();
  // The welcome is the last plain frame each way: the client sends nothing
  // between its auth and the welcome, and seals all it sends after.
  return peer.ep->ProtectSession(peer.handshake.Keys());
}

Status PeerSessions::Open() {
  AdmissionOptions admission;
  admission.max_unauthenticated = std::max<size_t>(1, server().max_unauthenticated);
  // Room kept for the cluster's own connections (a few a task) and files:
  // strangers may hold the table and as many refused ones waiting to close.
  size_t num_tasks = 0;
  for (const auto& [job, list] : server().cluster.jobs()) num_tasks += list.size();
  const size_t cluster_room = 4 * num_tasks + 64;
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 &&
                      files.rlim_cur < 2 * admission.max_unauthenticated + cluster_room) {
    const size_t fit =
        files.rlim_cur > cluster_room + 32 ? (files.rlim_cur - cluster_room) / 2 : 16;
    TLOG_WARN(
        "{} descriptors allowed (ulimit -n): at most {} connections may wait to "
        "authenticate, not {}, so that the cluster's own keep room",
        files.rlim_cur, fit, admission.max_unauthenticated);
    admission.max_unauthenticated = fit;
  }
  // Strangers get a quarter of the table: the rest is the cluster's.
  admission.max_strangers = std::max<size_t>(1, admission.max_unauthenticated / 4);
  auto hello_deadline = TimeoutFromEnv("TESSERA_HELLO_TIMEOUT_MS", server().hello_timeout);
  if (!hello_deadline.ok()) return hello_deadline.status();
  admission.hello_deadline = *hello_deadline;
  admission_ = std::make_unique<Admission>(admission);
  // The spec's hosts, as their connections will name them. A name that
  // does not resolve yet (a pod not yet scheduled) is learnt when its task
  // first proves itself.
  std::set<std::string> names;
  for (const auto& [job, tasks] : server().cluster.jobs()) {
    for (const auto& task : tasks) names.insert(task.host);
  }
  size_t addresses = 0;
  for (const auto& name : names) {
    for (const auto& address : transport::NumericAddressesOf(name)) {
      admission_->AddClusterHost(address);
      addresses++;
    }
  }
  TLOG_DEBUG(
      "admission: {} addresses of {} cluster hosts; strangers may hold {} of {} waiting "
      "connections",
      addresses, names.size(), admission.max_strangers, admission.max_unauthenticated);
  return Status::Ok();
}

void PeerSessions::Forget(const EndpointPtr& ep) {
  std::erase_if(closing_, [&](const auto& c) { return c.first == ep; });
  admission_->Forget(reinterpret_cast<uintptr_t>(ep.get()));
  peers_.erase(ep.get());
}

std::unordered_map<transport::Endpoint*, std::unique_ptr<Peer>> PeerSessions::CloseAll() {
  stopping_ = true;
  for (auto& [raw, peer] : peers_) peer->ep->Close();
  for (auto& [ep, deadline] : closing_) ep->Close();
  closing_.clear();
  std::unordered_map<transport::Endpoint*, std::unique_ptr<Peer>> peers;
  peers.swap(peers_);
  return peers;
}

}  // namespace tessera::server
