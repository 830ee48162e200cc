// Pulls: granted inline or under a lease once the version or step is
// there, held with a deadline until then; leases, their release and revoke.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/log.h"
#include "core/node_id.h"
#include "core/timeouts.h"
#include "gpu/cuda.h"
#include "kernels/update.h"
#include "server/shard.h"

namespace tessera::server {

void Shard::OnPull(Peer& peer, uint64_t request_id, wire::Pull msg) {
  for (const auto& e : msg.entries) {
    if (table_->Find(e.key_id) == nullptr) {
      return sessions_->SendError(
          peer, request_id, Status::NotFound("pull of unknown key id " + std::to_string(e.key_id)));
    }
  }
  PendingPull pull{&peer, request_id, std::move(msg)};
  if (ResumeForPull(pull)) RetryWaiting();  // pushes and pulls waiting for that step
  if (TryGrantPull(pull)) {
    spare_pulls_.Give(std::move(pull.msg));
    return;
  }
  Status st = waits_->Reachable(pull.msg);
  if (!st.ok()) return sessions_->SendError(peer, request_id, st);
  if (pull.msg.wait_ms > 0) {
    pull.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(pull.msg.wait_ms);
  }
  waiting_pulls_.push_back(std::move(pull));
  if (waiting_pulls_.back().deadline) ScheduleWaitSweep();
}

bool Shard::ResumeForPull(const PendingPull& pull) {
  if (pull.peer->hello.role != wire::PeerRole::kWorker) return false;
  const uint32_t rank = pull.peer->hello.task_index;
  bool moved = false;
  for (const auto& e : pull.msg.entries) {
    Param* p = table_->Find(e.key_id);
    if (!p->resuming || p->kind != Consistency::kSync || e.min_step <= p->step) continue;
    // The step after the one its lost push was for, or one more where the
    // restored step is the coordinator's estimate, one short (param_table.h).
    // Further is no lost push but a pull for a later step: it waits.
    if (e.min_step - p->step > 2) continue;
    if (rank >= p->contributed.size() || p->contributed[rank]) continue;  // it waits for its step
    if (p->agg_count >= p->entry.tensor.mode.replicas_to_aggregate) continue;  // about to apply
    // What the step gathered since the restore is dropped with it: this
    // shard's updates since its checkpoint are lost (training.md), and now
    // this step's too. Pushes of the skipped steps are dropped as stale.
    TLOG_WARN(
        "'{}' resumes at step {} (restored at {}, {} of its gradients dropped): {} pulls it "
        "without pushing step {} again, which it pushed before this task restarted",
        p->display_name, e.min_step, p->step, p->agg_count, pull.peer->hello.task, p->step);
    p->step = e.min_step;
    p->ResetAggregation();
    p->resuming = false;
    p->resume_at_first_push = false;
    moved = true;
  }
  return moved;
}

void Shard::ScheduleWaitSweep() {
  if (wait_sweep_scheduled_ || stopping_) return;
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const auto& p : waiting_pulls_) {
    if (p.deadline && (!earliest || *p.deadline < *earliest)) earliest = p.deadline;
  }
  if (!earliest) return;
  // At most 100 ms late, and never a wake-up more often while pulls wait.
  const auto in = std::chrono::duration_cast<std::chrono::milliseconds>(
      *earliest - std::chrono::steady_clock::now());
  wait_sweep_scheduled_ = true;
  ctx_->PostAfter(std::clamp(in, std::chrono::milliseconds(1), std::chrono::milliseconds(100)),
                  [this] {
                    wait_sweep_scheduled_ = false;
                    SweepWaitingPulls();
                  });
}

void Shard::SweepWaitingPulls() {
  if (stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    if (!it->deadline || *it->deadline > now) {
      ++it;
      continue;
    }
    const std::string what = waits_->WhatItWaitsFor(it->msg);
    TLOG_WARN("{}'s pull waited {} ms: {}", it->peer->hello.task, it->msg.wait_ms, what);
    sessions_->SendError(
        *it->peer, it->request_id,
        Status::DeadlineExceeded("waited " + std::to_string(it->msg.wait_ms) + " ms: " + what));
    spare_pulls_.Give(std::move(it->msg));
    it = waiting_pulls_.erase(it);
  }
  ScheduleWaitSweep();
}

void Shard::RecheckAfterRejoinGrace() {
  if (stopping_ || rejoin_recheck_scheduled_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto earliest = lent_.roster->NextRejoinDeadline(now);
  if (!earliest) return;
  rejoin_recheck_scheduled_ = true;
  ctx_->PostAfter(std::chrono::duration_cast<std::chrono::milliseconds>(*earliest - now) +
                      std::chrono::milliseconds(1),
                  [this] {
                    rejoin_recheck_scheduled_ = false;
                    if (stopping_) return;
                    RetryWaiting();
                    RecheckAfterRejoinGrace();  // the next departure still awaited
                  });
}

bool Shard::TryGrantPull(PendingPull& pull) {
  uint64_t total = 0;
  for (const auto& e : pull.msg.entries) {
    const Param* p = table_->Find(e.key_id);
    total += p->bytes;
    if (p->failed) {
      sessions_->SendError(*pull.peer, pull.request_id, p->failure());
      return true;
    }
    if (!p->initialized || p->version < e.min_version || p->StepReached() < e.min_step ||
        p->writer_waiting) {
      return false;
    }
  }
  Borrowed<wire::PullReply> borrowed(pull_reply_);
  wire::PullReply& reply = *borrowed;
  reply.lease_id = 0;
  reply.versions.clear();
  reply.data.clear();
  // Small pulls get the bytes in the reply: one round trip, no lease (the
  // copy is made here, between updates, so it is never half-applied).
  if (total <= std::min<uint64_t>(pull.msg.inline_max, wire::kMaxInlineBytes)) {
    reply.data.resize(total);
    reply.versions.reserve(pull.msg.entries.size());
    uint64_t at = 0;
    // Host memory, not staged: a copy per chunk, with no call or Status
    // per entry (a batch of small tensors is mostly this loop).
    const bool plain_host = memory_->is_host() && !table_->staged();
    for (const auto& e : pull.msg.entries) {
      const Param* p = table_->Find(e.key_id);
      if (plain_host) {
        std::memcpy(reply.data.data() + at, p->data, p->bytes);
      } else if (Status st = ReadValue(*p, reply.data.data() + at); !st.ok()) {
        sessions_->SendError(*pull.peer, pull.request_id,
                             st.WithContext("reading '" + p->display_name + "'"));
        return true;
      }
      at += p->bytes;
      reply.versions.push_back(p->version);
    }
    pulls_served_++;
    Reply(*pull.peer, pull.request_id, reply);
    return true;
  }
  LeaseTable::Lease lease{pull.peer->ep.get(),
                          LeaseTable::Task(pull.peer->hello.task),
                          {},
                          std::chrono::steady_clock::now() + options_.lease_timeout};
  for (const auto& e : pull.msg.entries) lease.keys.push_back(e.key_id);
  auto id = leases_.Grant(std::move(lease));
  if (!id.ok()) {
    sessions_->SendError(*pull.peer, pull.request_id, id.status());
    return true;
  }
  reply.lease_id = *id;
  for (const auto& e : pull.msg.entries) {
    Param* p = table_->Find(e.key_id);
    p->readers++;
    reply.versions.push_back(p->version);
  }
  pulls_served_++;
  Reply(*pull.peer, pull.request_id, reply);
  return true;
}

void Shard::OnRelease(Peer& peer, const wire::Release& msg) {
  auto lease = leases_.Release(msg.lease_id, peer.ep.get());
  if (!lease.ok()) {
    TLOG_WARN("{} released lease {} it does not hold", peer.hello.task, msg.lease_id);
    return;
  }
  EndLease(*lease);
  RetryWaiting();
}

void Shard::EndLease(const LeaseTable::Lease& lease) {
  for (uint32_t key : lease.keys) table_->Find(key)->readers--;
}

void Shard::RevokeExpiredLeases() {
  if (stopping_) return;
  auto expired = leases_.TakeExpired(std::chrono::steady_clock::now());
  for (const auto& [id, lease] : expired) {
    TLOG_WARN("{} held pull lease {} for longer than {} ms; revoked so updates can go on",
              std::string_view(lease.task), id, options_.lease_timeout.count());
    leases_revoked_++;
    EndLease(lease);
  }
  if (!expired.empty()) RetryWaiting();
  ctx_->PostAfter(LeaseCheckInterval(), [this] { RevokeExpiredLeases(); });
}

void Shard::RetryWaiting() {
  // Updates first (writers have priority), then the pulls they unblock. An
  // applied sync step can unblock pushes for the next step, which can
  // complete that one: repeat until nothing moves.
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto it = pending_steps_.begin(); it != pending_steps_.end();) {
      bool applied = TryApplyStep(*table_->Find(*it));
      moved |= applied;
      it = applied ? pending_steps_.erase(it) : std::next(it);
    }
    for (auto it = blocked_pushes_.begin(); it != blocked_pushes_.end();) {
      bool applied = TryApplyPush(*it);
      moved |= applied;
      if (applied) spare_pushes_.Give(std::move(it->msg));
      it = applied ? blocked_pushes_.erase(it) : std::next(it);
    }
  }
  MarkWaitingWriters();
  for (auto it = waiting_pulls_.begin(); it != waiting_pulls_.end();) {
    if (TryGrantPull(*it)) {
      spare_pulls_.Give(std::move(it->msg));
      it = waiting_pulls_.erase(it);
      continue;
    }
    // A sync step that lost the workers it needs fails its waiters, naming
    // who is gone, instead of leaving them to time out.
    Status st = waits_->Reachable(it->msg);
    if (!st.ok()) {
      sessions_->SendError(*it->peer, it->request_id, st);
      spare_pulls_.Give(std::move(it->msg));
      it = waiting_pulls_.erase(it);
      continue;
    }
    ++it;
  }
}

}  // namespace tessera::server
