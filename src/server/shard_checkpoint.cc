// The shard's part in membership, restore and checkpoint rounds (see
// coord/checkpointer.h for the round as a whole).
#include <fmt/format.h>

#include "core/log.h"
#include "kernels/update.h"
#include "server/shard.h"

namespace tessera::server {

using namespace std::chrono_literals;

// ---------------------------------------------------------------------------
// The coordinator's side

Status Shard::StartService() {
  coord::ServiceOptions o;
  o.name = options_.job + " task " + std::to_string(options_.task_index);
  o.num_shards = options_.cluster.num_tasks("ps");
  o.num_workers = options_.cluster.num_workers();
  o.local_shard = is_coordinator_only() ? -1 : options_.task_index;
  o.cluster_json = options_.cluster.ToJson();
  o.checkpoints.dir = options_.checkpoint_dir;
  o.checkpoints.every = options_.checkpoint_every;
  o.checkpoints.every_steps = options_.checkpoint_every_steps;
  o.checkpoints.keep = std::max(1, options_.keep_checkpoints);
  o.checkpoints.timeout = options_.checkpoint_timeout;
  o.checkpoints.key = checkpoint_key_;
  o.restore = options_.restore;
  o.new_run = options_.new_run;
  o.accept_legacy_checkpoints = options_.accept_legacy_checkpoints;
  coord::Service::Host host;
  host.send = [this](coord::PeerId peer, MessageBytes frame) {
    // A peer that left meanwhile (a worker waiting for a round) is skipped.
    auto it = peers_.find(reinterpret_cast<transport::Endpoint*>(peer));
    if (it != peers_.end()) it->second->ep->Send(kProtocolMsg, std::move(frame));
  };
  host.send_to_local_shard = [this](MessageBytes frame) {
    ctx_->Post([this, f = std::move(frame)] {
      if (!stopping_) checkpoints_->OnFrame(f);
    });
  };
  host.post = [this](std::function<void()> fn) { ctx_->Post(std::move(fn)); };
  host.post_after = [this](std::chrono::milliseconds d, std::function<void()> fn) {
    ctx_->PostAfter(d, std::move(fn));
  };
  service_ = std::make_unique<coord::Service>(std::move(o), std::move(host));
  return service_->Open();
}

void Shard::JoinLocalService() {
  // This task's table is empty here (it just started): the join says so.
  // The answer comes once every ps task joined: what to restore, and the
  // global step (rebuilt, after a restart) its sync tensors resume at.
  service_->JoinLocal(wire::Join{}, [this](const wire::JoinReply& reply) {
    if (!stopping_) FirstJoined(reply);
  });
}

void Shard::FirstJoined(const wire::JoinReply& reply) {
  if (!reply.restore_path.empty()) {
    Status st = OpenRestore(reply.restore_path, reply.global_step);
    if (!st.ok()) {
      TLOG_ERROR("cannot restore from {}: {}; tensors start uninitialised", reply.restore_path,
                 st.message());
    }
  }
  joined_ = true;
  ServeDeferredCreates();
}

uint64_t Shard::SyncStepReached() const {
  uint64_t step = 0;
  table_->ForEach([&](const Param& p) {
    if (p.initialized && p.entry.tensor.mode.kind == Consistency::kSync)
      step = std::max(step, p.step);
  });
  return step;
}

std::vector<wire::Join> Shard::JoinMessages() const {
  std::vector<wire::Join> joins(1);
  joins.back().more = true;  // the join's end follows them
  table_->ForEach([&](const Param& p) {
    if (joins.back().chunks.size() == wire::Join::kMaxChunks) {
      joins.emplace_back();
      joins.back().more = true;
    }
    wire::CreateEntry e = p.entry;
    e.tensor.hyper = p.hyper;  // as set at run time
    joins.back().chunks.push_back(std::move(e));
    joins.back().initialized.push_back(p.initialized ? 1 : 0);
  });
  return joins;
}

// ---------------------------------------------------------------------------
// A ps task's link to the coordinator

void Shard::JoinCoordinator() {
  if (stopping_ || coord_link_) return;
  const TaskId coord_task = options_.cluster.coordinator();
  const TaskAddress addr = options_.cluster.address(coord_task).value();
  ctx_->Connect(addr.host, addr.port, 2000ms,
                [this, coord_task, addr](Result<std::shared_ptr<transport::Endpoint>> ep) {
                  if (stopping_) {
                    if (ep.ok()) (*ep)->Close();
                    return;
                  }
                  if (!ep.ok()) {
                    const auto now = std::chrono::steady_clock::now();
                    if (now >= next_join_report_) {
                      TLOG_INFO("waiting for the coordinator {} at {}: {}", coord_task.ToString(),
                                addr.ToString(), ep.status().message());
                      next_join_report_ = now + 10s;
                    }
                    ctx_->PostAfter(300ms, [this] { JoinCoordinator(); });
                    return;
                  }
                  coord_link_ = *ep;
                  wire::Hello hello;
                  hello.role = wire::PeerRole::kShard;
                  hello.task_index = static_cast<uint32_t>(options_.task_index);
                  hello.task = TaskId{"ps", options_.task_index}.ToString();
                  hello.cluster = options_.cluster.ToJson();
                  hello.protection = options_.session_protection;
                  link_handshake_.emplace(options_.secret, std::move(hello));
                  coord_link_->Send(kProtocolMsg, wire::Encode(link_handshake_->hello(), 1));
                  // No welcome by the hello deadline (the coordinator's own):
                  // it may never have seen this connection. A new one.
                  std::weak_ptr<transport::Endpoint> sent_on = coord_link_;
                  const auto limit = admission_->options().hello_deadline;
                  ctx_->PostAfter(limit, [this, sent_on, limit] {
                    if (stopping_ || !link_handshake_ || coord_link_ != sent_on.lock()) return;
                    TLOG_WARN(
                        "the coordinator took the connection but did not finish the handshake "
                        "within {} ms; joining again",
                        limit.count());
                    link_handshake_.reset();
                    auto link = std::move(coord_link_);
                    link->Abort();
                    JoinCoordinator();
                  });
                });
}

void Shard::OnLinkFrame(std::span<const uint8_t> frame) {
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) {
    auto link = coord_link_;
    OnLinkLost(h.status().WithContext("bad message from the coordinator"));
    link->Close();
    return;
  }
  switch (h->opcode) {
    case wire::Opcode::kChallenge:
    case wire::Opcode::kWelcome: {
      if (!link_handshake_) return RefuseCoordinator(Status::Internal("handshake out of turn"));
      const uint32_t expect =
          options_.cluster.separate_coordinator() ? wire::kCoordinatorIndex : 0u;
      auto next = link_handshake_->OnFrame(frame, expect, "the coordinator");
      if (!next.ok()) return RefuseCoordinator(next.status());
      if (const auto* auth = std::get_if<wire::Auth>(&*next)) {
        coord_link_->Send(kProtocolMsg, wire::Encode(*auth, 2));
        return;
      }
      if (std::get<wire::Welcome>(*next).session_protected()) {
        // Before anything else is sent: the coordinator seals all after its welcome.
        if (Status sealed = coord_link_->ProtectSession(link_handshake_->Keys()); !sealed.ok()) {
          return RefuseCoordinator(sealed);
        }
      }
      link_handshake_.reset();
      coord_link_->MarkAuthenticated();
      // The chunks, then the last sync steps reported (a restarted
      // coordinator counts the global step from them; one that lived
      // ignores steps it counted) and those counted while the link was
      // down, then the join's end: the coordinator answers workers once
      // every ps task got that far, so its global step is whole by then.
      for (const auto& join : JoinMessages()) {
        coord_link_->Send(kProtocolMsg, wire::Encode(join, 3));
      }
      for (const auto& report : step_counter_.Recent()) {
        coord_link_->Send(kProtocolMsg, wire::Encode(report, 0));
      }
      for (const auto& report : step_counter_.TakeReports()) {
        coord_link_->Send(kProtocolMsg, wire::Encode(report, 0));
      }
      wire::Join end;
      end.sync_step = SyncStepReached();
      coord_link_->Send(kProtocolMsg, wire::Encode(end, 3));
      return;
    }
    case wire::Opcode::kJoinReply: {
      auto m = wire::DecodeBody<wire::JoinReply>(*h, frame);
      if (m.ok()) OnJoined(*m);
      return;
    }
    case wire::Opcode::kCkptPrepare:
    case wire::Opcode::kCkptWrite:
    case wire::Opcode::kCkptAbort:
      return checkpoints_->OnFrame(frame);
    case wire::Opcode::kBye:
      coordinator_said_bye_ = true;
      coord_link_->Send(kProtocolMsg, wire::Encode(wire::Ack{}, h->request_id));
      NoteCoordinatorStopped();
      CheckPresence();  // this task's end may have waited for the coordinator's
      return;
    case wire::Opcode::kAck:
      if (h->request_id == kByeRequestId) OnByeAnswered(coord_link_.get());
      return;
    case wire::Opcode::kError: {
      auto err = wire::DecodeBody<wire::Error>(*h, frame);
      Status st = err.ok() ? Status(err->code, err->message) : err.status();
      if (link_handshake_) return RefuseCoordinator(st);  // it refused this task
      TLOG_ERROR("the coordinator: {}", st.message());
      return;
    }
    default:
      return;
  }
}

void Shard::OnJoined(const wire::JoinReply& reply) {
  link_joined_ = true;
  ReportSteps();  // what was counted since the join went
  if (joined_) {
    TLOG_INFO("rejoined the coordinator");
    return;
  }
  TLOG_INFO("joined the coordinator (global step {})", reply.global_step);
  FirstJoined(reply);
}

void Shard::ServeDeferredCreates() {
  auto deferred = std::move(deferred_creates_);
  deferred_creates_.clear();
  for (auto& [ep, request_id, msg] : deferred) {
    auto it = peers_.find(ep.get());
    if (it != peers_.end()) OnCreate(*it->second, request_id, msg);
  }
}

void Shard::RefuseCoordinator(const Status& why) {
  TLOG_ERROR("could not join the coordinator: {}; trying again in 5 s", why.message());
  link_handshake_.reset();
  link_joined_ = false;
  auto link = std::move(coord_link_);
  if (link) link->Close();
  if (!stopping_) ctx_->PostAfter(5s, [this] { JoinCoordinator(); });
}

void Shard::NoteCoordinatorStopped() {
  std::lock_guard<std::mutex> lock(verdict_mu_);
  coordinator_stopped_ = true;
  verdict_cv_.notify_all();
}

bool Shard::WaitForCoordinatorToStop(std::chrono::milliseconds limit) {
  if (hosts_coordinator()) return true;
  std::unique_lock<std::mutex> lock(verdict_mu_);
  return verdict_cv_.wait_for(lock, limit, [&] { return coordinator_stopped_; });
}

void Shard::OnLinkLost(const Status& why) {
  if (!coord_link_) return;
  coord_link_.reset();
  link_joined_ = false;
  NoteCoordinatorStopped();  // whoever waits for its stop waits no more
  if (stopping_) return;
  if (coordinator_said_bye_) {
    TLOG_INFO("the coordinator stopped; joining it again when it is back");
  } else {
    TLOG_WARN("lost the coordinator: {}; rejoining", why.message());
  }
  coordinator_said_bye_ = false;
  checkpoints_->Abandon();
  ctx_->PostAfter(1s, [this] { JoinCoordinator(); });
}

// ---------------------------------------------------------------------------
// Restore

Status Shard::OpenRestore(const std::string& path, uint64_t step) {
  auto c = ckpt::Checkpoint::Open(path, {.verify_data = false,
                                         .accept_legacy = options_.accept_legacy_checkpoints,
                                         .key = checkpoint_key_});
  if (!c.ok()) return c.status();
  restore_ = std::make_unique<ckpt::Checkpoint>(std::move(*c));
  restore_step_ = step;
  TLOG_INFO("tensors are restored from {} as they are created (sync tensors resume at step {})",
            path, step);
  return Status::Ok();
}

void Shard::RestoreChunk(Param& p) {
  const auto& t = p.entry.tensor;
  const ckpt::TensorRecord* rec = restore_->Find(t.name);
  if (rec == nullptr) return;
  if (rec->dtype != t.dtype || rec->shape != t.shape) {
    TLOG_WARN("'{}' is {} in {} but is now declared {}: not restored (the chief initialises it)",
              t.name, DescribeTensor(rec->dtype, rec->shape), restore_->path,
              DescribeTensor(t.dtype, t.shape));
    return;
  }
  const uint64_t first = p.entry.elem_offset;
  // Reads a slot into the shard's memory: directly into host memory, through
  // a host buffer into a GPU's.
  std::vector<uint8_t> host;
  auto read = [&](ckpt::Slot slot, uint64_t offset, uint64_t bytes, uint8_t* dst) -> Status {
    if (memory_->is_host()) return restore_->ReadSlot(t.name, slot, offset, bytes, dst);
    host.resize(bytes);
    TESSERA_RETURN_IF_ERROR(restore_->ReadSlot(t.name, slot, offset, bytes, host.data()));
    return memory_->FromHost(dst, host.data(), bytes);
  };
  Status st = read(ckpt::Slot::kParam, first * DTypeSize(t.dtype), p.bytes, p.data);
  const bool same_rule = rec->rule == t.rule;
  if (st.ok() && same_rule) {
    const uint64_t ssize = kernels::StateElementSize(t.dtype);
    if (st.ok() && !p.state0.empty())
      st = read(ckpt::Slot::kState0, first * ssize, p.state0.size(), p.state0.data());
    if (st.ok() && !p.state1.empty())
      st = read(ckpt::Slot::kState1, first * ssize, p.state1.size(), p.state1.data());
    if (st.ok() && !p.master.empty())
      st = read(ckpt::Slot::kMaster, first * 4, p.master.size(), p.master.data());
  }
  if (st.ok()) st = Publish(p);
  if (!st.ok()) {
    TLOG_ERROR("'{}' not restored: {}", p.display_name, st.message());
    Status zeroed = memory_->Zero(p.data, p.bytes);
    if (zeroed.ok()) zeroed = Publish(p);
    if (!zeroed.ok()) TLOG_ERROR("'{}': {}", p.display_name, zeroed.message());
    return;
  }
  if (same_rule) {
    p.updates = rec->updates;
  } else {
    TLOG_WARN(
        "'{}' was saved with rule {} and is now declared with {}: its value is restored, "
        "its optimizer state starts afresh",
        t.name, UpdateRuleName(rec->rule), UpdateRuleName(t.rule));
    if (Status reset = memory_->ResetRuleState(t.rule, p.hyper, t.dtype, p.data, p.entry.elem_count,
                                               p.rule_state());
        !reset.ok()) {
      TLOG_ERROR("'{}': optimizer state not reset: {}", p.display_name, reset.message());
    }
    p.updates = 0;
  }
  p.version = 1;
  p.initialized = true;
  if (t.mode.kind == Consistency::kSync) {
    p.step = restore_step_;
    p.resume_at_first_push = true;
    p.resuming = true;
  }
  std::fill(p.pushed_steps.begin(), p.pushed_steps.end(), restore_step_);
  chunks_restored_++;
}

// ---------------------------------------------------------------------------
// Messages to the coordinator (checkpoint rounds: checkpoint_participant.h)

void Shard::SendToCoordinator(MessageBytes frame) {
  if (hosts_coordinator()) {
    ctx_->Post([this, f = std::move(frame)] {
      if (!stopping_ && service_) service_->OnLocalShardFrame(f);
    });
    return;
  }
  if (coord_link_) coord_link_->Send(kProtocolMsg, std::move(frame));
}

}  // namespace tessera::server
