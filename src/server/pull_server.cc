#include "server/pull_server.h"

#include <algorithm>
#include <cstring>

#include "core/borrowed.h"
#include "core/log.h"
#include "wire/limits.h"

namespace tessera::server {
namespace {

std::chrono::milliseconds LeaseCheckInterval(std::chrono::milliseconds lease_timeout) {
  return std::clamp(lease_timeout / 4, std::chrono::milliseconds(10),
                    std::chrono::milliseconds(1000));
}

}  // namespace

void PullServer::Begin() {
  lent_.ctx->PostAfter(LeaseCheckInterval(lent_.lease_timeout), [this] { RevokeExpiredLeases(); });
}

Status PullServer::CheckKeys(const wire::Pull& msg) const {
  for (const auto& e : msg.entries) {
    if (lent_.table->Find(e.key_id) == nullptr) {
      return Status::NotFound("pull of unknown key id " + std::to_string(e.key_id));
    }
  }
  return Status::Ok();
}

void PullServer::Serve(Peer& peer, uint64_t request_id, wire::Pull msg) {
  Held pull{&peer, request_id, std::move(msg), std::nullopt};
  if (TryGrant(pull)) {
    spares_.Give(std::move(pull.msg));
    return;
  }
  Status st = waits_.Reachable(pull.msg);
  if (!st.ok()) return lent_.sessions->SendError(peer, request_id, st);
  if (pull.msg.wait_ms > 0) {
    pull.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(pull.msg.wait_ms);
  }
  held_.push_back(std::move(pull));
  if (held_.back().deadline) ScheduleSweep();
}

void PullServer::ServeWeights(Peer& peer, uint64_t request_id, const wire::Push& push,
                              const std::vector<uint64_t>& versions) {
  // The gradients came inline, and weights are as large. Built in a spare
  // pull message, whose vector keeps its capacity.
  Held pull{&peer, request_id, spares_.Take(), std::nullopt};
  pull.msg.entries.clear();
  pull.msg.wait_ms = 0;
  pull.msg.inline_max = static_cast<uint32_t>(push.payload.size());
  pull.msg.entries.reserve(push.entries.size());
  for (size_t i = 0; i < push.entries.size(); ++i) {
    pull.msg.entries.push_back({push.entries[i].key_id, versions[i], 0});
  }
  if (TryGrant(pull)) {
    spares_.Give(std::move(pull.msg));
  } else {
    held_.push_back(std::move(pull));
  }
}

bool PullServer::TryGrant(Held& pull) {
  uint64_t total = 0;
  for (const auto& e : pull.msg.entries) {
    const Param* p = lent_.table->Find(e.key_id);
    total += p->bytes;
    if (p->failed) {
      lent_.sessions->SendError(*pull.peer, pull.request_id, p->failure());
      return true;
    }
    if (!p->initialized || p->version < e.min_version || p->StepReached() < e.min_step ||
        p->writer_waiting) {
      return false;
    }
  }
  // Small pulls get the bytes in the reply (the copy is made here, between
  // updates, so it is never half-applied).
  if (total <= std::min<uint64_t>(pull.msg.inline_max, wire::kMaxInlineBytes)) {
    ReplyInline(pull, total);
  } else {
    ReplyWithLease(pull);
  }
  return true;
}

void PullServer::ReplyInline(Held& pull, uint64_t total) {
  Borrowed<wire::PullReply> borrowed(reply_);
  wire::PullReply& reply = *borrowed;
  reply.lease_id = 0;
  reply.versions.clear();
  reply.data.resize(total);
  reply.versions.reserve(pull.msg.entries.size());
  uint64_t at = 0;
  // Host memory, not staged: a copy per chunk, with no call or Status per
  // entry (a batch of small tensors is mostly this loop).
  const bool plain_host = lent_.target.host && !lent_.target.staged;
  for (const auto& e : pull.msg.entries) {
    const Param* p = lent_.table->Find(e.key_id);
    if (plain_host) {
      std::memcpy(reply.data.data() + at, p->data, p->bytes);
    } else if (Status st = apply::ReadValue(lent_.target, *p, reply.data.data() + at); !st.ok()) {
      return lent_.sessions->SendError(*pull.peer, pull.request_id,
                                       st.WithContext("reading '" + p->display_name + "'"));
    }
    at += p->bytes;
    reply.versions.push_back(p->version);
  }
  served_++;
  pull.peer->ep->Send(wire::kProtocolMsg, wire::Encode(reply, pull.request_id));
}

void PullServer::ReplyWithLease(Held& pull) {
  LeaseTable::Lease lease{pull.peer->ep.get(),
                          LeaseTable::Task(pull.peer->hello.task),
                          {},
                          std::chrono::steady_clock::now() + lent_.lease_timeout};
  for (const auto& e : pull.msg.entries) lease.keys.push_back(e.key_id);
  auto id = leases_.Grant(std::move(lease));
  if (!id.ok()) return lent_.sessions->SendError(*pull.peer, pull.request_id, id.status());
  Borrowed<wire::PullReply> borrowed(reply_);
  wire::PullReply& reply = *borrowed;
  reply.lease_id = *id;
  reply.versions.clear();
  reply.data.clear();
  for (const auto& e : pull.msg.entries) {
    Param* p = lent_.table->Find(e.key_id);
    p->readers++;
    reply.versions.push_back(p->version);
  }
  served_++;
  pull.peer->ep->Send(wire::kProtocolMsg, wire::Encode(reply, pull.request_id));
}

void PullServer::GrantWaiting() {
  for (auto it = held_.begin(); it != held_.end();) {
    if (TryGrant(*it)) {
      spares_.Give(std::move(it->msg));
      it = held_.erase(it);
      continue;
    }
    // A sync step that lost the workers it needs fails its waiters, naming
    // who is gone, instead of leaving them to time out.
    Status st = waits_.Reachable(it->msg);
    if (!st.ok()) {
      lent_.sessions->SendError(*it->peer, it->request_id, st);
      spares_.Give(std::move(it->msg));
      it = held_.erase(it);
      continue;
    }
    ++it;
  }
}

void PullServer::ScheduleSweep() {
  if (sweep_scheduled_ || stopping_) return;
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const auto& p : held_) {
    if (p.deadline && (!earliest || *p.deadline < *earliest)) earliest = p.deadline;
  }
  if (!earliest) return;
  // At most 100 ms late, and never a wake-up more often while pulls wait.
  const auto in = std::chrono::duration_cast<std::chrono::milliseconds>(
      *earliest - std::chrono::steady_clock::now());
  sweep_scheduled_ = true;
  lent_.ctx->PostAfter(std::clamp(in, std::chrono::milliseconds(1), std::chrono::milliseconds(100)),
                       [this] {
                         sweep_scheduled_ = false;
                         SweepExpired();
                       });
}

void PullServer::SweepExpired() {
  if (stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (!it->deadline || *it->deadline > now) {
      ++it;
      continue;
    }
    const std::string what = waits_.WhatItWaitsFor(it->msg);
    TLOG_WARN("{}'s pull waited {} ms: {}", it->peer->hello.task, it->msg.wait_ms, what);
    lent_.sessions->SendError(
        *it->peer, it->request_id,
        Status::DeadlineExceeded("waited " + std::to_string(it->msg.wait_ms) + " ms: " + what));
    spares_.Give(std::move(it->msg));
    it = held_.erase(it);
  }
  ScheduleSweep();
}

bool PullServer::Release(const Peer& peer, const wire::Release& msg) {
  auto lease = leases_.Release(msg.lease_id, peer.ep.get());
  if (!lease.ok()) {
    TLOG_WARN("{} released lease {} it does not hold", peer.hello.task, msg.lease_id);
    return false;
  }
  EndLease(*lease);
  return true;
}

bool PullServer::PeerGone(const Peer& peer) {
  auto ended = leases_.ReleaseAllOf(peer.ep.get());
  for (const auto& e : ended) EndLease(e.lease);
  std::erase_if(held_, [&](const Held& p) { return p.peer == &peer; });
  return !ended.empty();
}

void PullServer::EndLease(const LeaseTable::Lease& lease) {
  for (uint32_t key : lease.keys) lent_.table->Find(key)->readers--;
}

void PullServer::RevokeExpiredLeases() {
  if (stopping_) return;
  auto expired = leases_.TakeExpired(std::chrono::steady_clock::now());
  for (const auto& [id, lease] : expired) {
    TLOG_WARN("{} held pull lease {} for longer than {} ms; revoked so updates can go on",
              std::string_view(lease.task), id, lent_.lease_timeout.count());
    leases_revoked_++;
    EndLease(lease);
  }
  if (!expired.empty()) lent_.readers_left();
  lent_.ctx->PostAfter(LeaseCheckInterval(lent_.lease_timeout), [this] { RevokeExpiredLeases(); });
}

void PullServer::Stop() {
  stopping_ = true;
  leases_.Clear();
  held_.clear();
}

void PullServer::AddStats(ServerStats* s) const {
  s->pulls_served = served_;
  s->leases_revoked = leases_revoked_;
}

}  // namespace tessera::server
