#include "coord/service.h"

#include <filesystem>

#include "core/log.h"

namespace tessera::coord {
namespace {

template <typename Msg>
void Reply(const Service::Host& host, PeerId peer, uint64_t request_id, const Msg& msg) {
  host.send(peer, wire::Encode(msg, request_id));
}

// The error a request gets, prefixed with this task's name.
void SendError(const Service::Host& host, const std::string& name, PeerId peer, uint64_t request_id,
               const Status& st) {
  Reply(host, peer, request_id, wire::Error{st.code(), name + ": " + st.message()});
}

}  // namespace

Service::Service(ServiceOptions options, Host host)
    : options_(std::move(options)),
      host_(std::move(host)),
      coord_(options_.num_shards, options_.num_workers, options_.limits),
      links_(static_cast<size_t>(options_.num_shards), 0),
      joins_(options_.num_shards),
      held_(options_.max_waiting_requests, options_.max_waiting_bytes) {}

Service::~Service() = default;

Status Service::Open() {
  const std::string& dir = options_.checkpoints.dir;
  if (dir.empty()) return Status::Ok();
  if (options_.new_run) {
    auto aside = ckpt::MoveStepDirsAside(dir);
    if (!aside.ok()) return aside.status().WithContext("starting a new run in " + dir);
    if (!aside->empty()) {
      TLOG_INFO("a new run in {}: the earlier run's checkpoints were moved to {}", dir, *aside);
    }
    return Status::Ok();
  }
  if (!options_.restore) {
    // Starting afresh beside an earlier run's checkpoints mixes the runs: a
    // restart restores the newest, whichever run wrote it.
    const auto earlier = ckpt::ListStepDirs(dir);
    if (earlier.empty()) return Status::Ok();
    return Status::FailedPrecondition(
        dir + " holds " + std::to_string(earlier.size()) + " checkpoint(s) of an earlier run (" +
        std::filesystem::path(earlier.front()).filename().string() +
        (earlier.size() > 1 ? ", ..." : "") +
        "): starting afresh there would mix the two runs, and a restart would restore the "
        "newest of either. Start with --new-run to move them aside (into " +
        dir + "/earlier-run-<time>/), or give another directory");
  }
  auto found = ckpt::FindNewestCheckpoint(dir, {.verify_data = true,
                                                .accept_legacy = options_.accept_legacy_checkpoints,
                                                .key = options_.checkpoints.key});
  if (found.status().code() == StatusCode::kNotFound) {
    TLOG_INFO("no checkpoint in {}: starting afresh", dir);
    return Status::Ok();
  }
  if (!found.ok()) {
    return found.status().WithContext(
        "restoring (start with --new-run to move them aside and begin afresh)");
  }
  restored_ = std::make_unique<ckpt::Checkpoint>(std::move(*found));
  restore_path_ = restored_->path;
  coord_.RestoreFrom(restored_.get());
  global_step_ = coord_.global_step();
  TLOG_INFO("restoring checkpoint {}: global step {}, {} tensors (saved by {} ps tasks)",
            restored_->path, restored_->manifest.global_step, restored_->manifest.tensors.size(),
            restored_->manifest.num_shards);
  return Status::Ok();
}

void Service::Start() {
  if (options_.checkpoints.dir.empty()) return;
  Checkpointer::Host host;
  host.send_to_shard = [this](int k, MessageBytes frame) {
    if (k == options_.local_shard) {
      host_.send_to_local_shard(std::move(frame));
      return true;
    }
    const PeerId link = links_[static_cast<size_t>(k)];
    if (link == 0) return false;
    host_.send(link, std::move(frame));
    return true;
  };
  host.post = host_.post;
  host.post_after = host_.post_after;
  host.on_saved = [this](const SavedCheckpoint&) { rounds_.Written(); };
  host.on_failed = [this](Checkpointer::Reason reason, const Status& why) {
    rounds_.Failed(std::string(Checkpointer::ReasonName(reason)) + " checkpoint: " + why.message());
  };
  checkpointer_ =
      std::make_unique<Checkpointer>(options_.checkpoints, &coord_, options_.cluster_json, host);
  if (restored_) checkpointer_->set_latest(restored_->manifest.global_step, restored_->path);
  checkpointer_->Start();
}

void Service::SaveFinal(std::function<void()> done) {
  if (!checkpointer_) return done();
  checkpointer_->Save(Checkpointer::Reason::kShutdown,
                      [done = std::move(done)](const Result<SavedCheckpoint>& r) {
                        if (!r.ok()) TLOG_INFO("no final checkpoint: {}", r.status().message());
                        done();
                      });
}

void Service::Stop() {
  stopped_ = true;
  if (checkpointer_) {
    checkpointer_->Stop();
    checkpointer_.reset();  // on the progress thread: its callbacks run there
  }
  init_waiters_.clear();
  held_.Clear();
}

bool Service::Serves(wire::Opcode op) { return wire::AddressesCoordinator(op); }

void Service::CheckReady() {
  if (!joins_.open() && joins_.all_joined()) {
    // The global step is rebuilt: the joins may hear where restored sync
    // chunks resume. (A restarted ps task 0 learns its own chunks back only
    // from the creates its answer lets in.)
    JoinGate::Held held = joins_.Open();
    const wire::JoinReply answer = JoinAnswer();
    for (const auto& [shard, waiter] : held.remote)
      Reply(host_, waiter.first, waiter.second, answer);
    if (held.local) held.local(answer);
  }
  if (!ready_ && joins_.open() && coord_.placement_known()) {
    ready_ = true;
    coord_.AdoptionDone();
    if (coord_.num_tensors() > 0) {
      TLOG_INFO("every ps task joined: {} tensors placed as before, global step {}{}",
                coord_.num_tensors(), coord_.global_step(),
                coord_.initialized() ? ", initialised" : "");
    }
  }
  while (ready_ && !held_.empty() && !stopped_) {
    HeldRequests::Request r = held_.Take();
    Serve(r.from, r.header, r.frame);
  }
}

void Service::OnWorkerRequest(const WorkerRef& from, const wire::Header& h,
                              std::span<const uint8_t> frame) {
  if (stopped_) return;
  if (ready_ && held_.empty()) return Serve(from, h, frame);
  const bool first = held_.empty();
  if (Status held = held_.Hold(from, h, frame); !held.ok()) {
    return SendError(host_, options_.name, from.peer, h.request_id, held);
  }
  if (first) {
    const std::string missing = joins_.Missing();
    TLOG_INFO("{}'s {} waits until {}", from.task, wire::OpcodeName(h.opcode),
              missing.empty() ? "every tensor's chunks are known again"
                              : missing + " joined the coordinator");
  }
}

void Service::Serve(const WorkerRef& from, const wire::Header& h, std::span<const uint8_t> frame) {
  auto bad = [&](const Status& st) {
    SendError(host_, options_.name, from.peer, h.request_id,
              st.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
  };
  const bool reader_may = h.opcode == wire::Opcode::kDeclare ||
                          h.opcode == wire::Opcode::kGetStep || h.opcode == wire::Opcode::kWaitInit;
  if (from.reader && !reader_may) {
    return SendError(
        host_, options_.name, from.peer, h.request_id,
        Status::PermissionDenied(std::string(wire::OpcodeName(h.opcode)) + " from reader " +
                                 from.task + ", a read-only client"));
  }
  switch (h.opcode) {
    case wire::Opcode::kDeclare: {
      auto m = wire::DecodeBody<wire::Declare>(h, frame);
      if (!m.ok()) return bad(m.status());
      auto reply = from.reader ? coord_.Lookup(*m, from.task)
                               : coord_.Declare(*m, from.task, from.rank == 0);
      if (!reply.ok())
        return SendError(host_, options_.name, from.peer, h.request_id, reply.status());
      return Reply(host_, from.peer, h.request_id, *reply);
    }
    case wire::Opcode::kDeclareTable: {
      auto m = wire::DecodeBody<wire::DeclareTable>(h, frame);
      if (!m.ok()) return bad(m.status());
      auto reply = tables_.Declare(m->table, from.task);
      if (!reply.ok())
        return SendError(host_, options_.name, from.peer, h.request_id, reply.status());
      return Reply(host_, from.peer, h.request_id, *reply);
    }
    case wire::Opcode::kGetStep:
      return Reply(host_, from.peer, h.request_id, wire::StepReply{coord_.global_step()});
    case wire::Opcode::kUpdateHyper: {
      if (from.rank != 0) {
        return SendError(host_, options_.name, from.peer, h.request_id,
                         Status::PermissionDenied(from.task + " is not the chief"));
      }
      auto m = wire::DecodeBody<wire::UpdateHyper>(h, frame);
      if (!m.ok()) return bad(m.status());
      Status st = coord_.UpdateHyper(*m);
      if (!st.ok()) return SendError(host_, options_.name, from.peer, h.request_id, st);
      return Reply(host_, from.peer, h.request_id, wire::Ack{});
    }
    case wire::Opcode::kSaveCheckpoint:
      return OnSaveCheckpoint(from, h.request_id);
    case wire::Opcode::kInitDone: {
      auto m = wire::DecodeBody<wire::InitDone>(h, frame);
      if (!m.ok()) return bad(m.status());
      return OnInitDone(from, h.request_id, *m);
    }
    case wire::Opcode::kWaitInit:
      if (coord_.EveryTensorInitialized()) {
        return Reply(host_, from.peer, h.request_id,
                     wire::StepReply{coord_.StartStepForLateWorker()});
      }
      init_waiters_.emplace_back(from.peer, h.request_id);
      return;
    default:
      return SendError(host_, options_.name, from.peer, h.request_id,
                       Status::InvalidArgument(std::string(wire::OpcodeName(h.opcode)) +
                                               " is not a request to the coordinator"));
  }
}

void Service::OnInitDone(const WorkerRef& from, uint64_t request_id, const wire::InitDone& done) {
  if (from.rank != 0) {
    return SendError(host_, options_.name, from.peer, request_id,
                     Status::PermissionDenied(from.task + " is not the chief"));
  }
  TLOG_INFO("chief {} initialised the parameters (sync tensors start at step {})", from.task,
            done.start_step);
  coord_.MarkInitialized(done.start_step);
  Reply(host_, from.peer, request_id, wire::Ack{});
  // Those who waited get the chief's number itself: the global step may
  // have moved on since the chief read it (the shards' reports of earlier
  // steps arrive after the fact), and every worker must start where the
  // fresh tensors are.
  for (auto& [waiter, req] : init_waiters_)
    Reply(host_, waiter, req, wire::StepReply{done.start_step});
  init_waiters_.clear();
}

void Service::OnSaveCheckpoint(const WorkerRef& from, uint64_t request_id) {
  if (!checkpointer_) {
    return SendError(host_, options_.name, from.peer, request_id,
                     Status::FailedPrecondition(
                         "checkpoints are off: start the coordinator with a checkpoint directory "
                         "(--checkpoint-dir)"));
  }
  // The worker may be gone when the round ends: the host drops frames to
  // connections it no longer has.
  checkpointer_->Save(Checkpointer::Reason::kRequest, [this, peer = from.peer,
                                                       request_id](Result<SavedCheckpoint> r) {
    if (!r.ok()) return SendError(host_, options_.name, peer, request_id, r.status());
    Reply(host_, peer, request_id, wire::CheckpointSaved{r->global_step, r->path});
  });
}

Status Service::Join(int shard, const wire::Join& join) {
  for (size_t i = 0; i < join.chunks.size(); ++i) {
    const bool initialized = i < join.initialized.size() && join.initialized[i] != 0;
    TESSERA_RETURN_IF_ERROR(coord_.Adopt(shard, join.chunks[i], initialized));
  }
  if (join.more) return Status::Ok();
  coord_.NoteSyncStepReached(join.sync_step);
  global_step_ = coord_.global_step();
  joins_.Joined(shard);
  CheckReady();
  return Status::Ok();
}

wire::JoinReply Service::JoinAnswer() const {
  return {checkpointer_ ? checkpointer_->latest_path() : restore_path_, coord_.global_step()};
}

void Service::JoinLocal(const wire::Join& join,
                        std::function<void(const wire::JoinReply&)> answer) {
  joins_.HoldLocal(std::move(answer));
  Status st = Join(options_.local_shard, join);  // answers it when all is known
  if (!st.ok()) TLOG_ERROR("ps task {}'s own chunks: {}", options_.local_shard, st.message());
}

void Service::OnLocalChunksCreated(const wire::Join& created) {
  // Placed here already in the usual case (then only checked); after a
  // restart of this task, how the coordinator learns its chunks back.
  for (size_t i = 0; i < created.chunks.size(); ++i) {
    const bool initialized = i < created.initialized.size() && created.initialized[i] != 0;
    Status st = coord_.Adopt(options_.local_shard, created.chunks[i], initialized);
    if (!st.ok()) TLOG_ERROR("ps task {}: {}", options_.local_shard, st.message());
  }
  CheckReady();
}

Status Service::OnShardFrame(PeerId from, int shard, const wire::Header& h,
                             std::span<const uint8_t> frame) {
  if (stopped_) return Status::Ok();
  switch (h.opcode) {
    case wire::Opcode::kJoin: {
      auto m = wire::DecodeBody<wire::Join>(h, frame);
      if (!m.ok()) return m.status();
      TESSERA_RETURN_IF_ERROR(Join(shard, *m));
      if (m->more) return Status::Ok();
      links_[static_cast<size_t>(shard)] = from;
      TLOG_INFO("ps task {} joined", shard);
      if (!joins_.open()) {
        joins_.HoldRemote(shard, from, h.request_id);
        return Status::Ok();
      }
      Reply(host_, from, h.request_id, JoinAnswer());
      return Status::Ok();
    }
    case wire::Opcode::kStepsApplied: {
      auto m = wire::DecodeBody<wire::StepsApplied>(h, frame);
      if (!m.ok()) return m.status();
      return OnStepsApplied(shard, *m);
    }
    case wire::Opcode::kCkptPrepared:
    case wire::Opcode::kCkptWritten:
      if (checkpointer_) checkpointer_->OnFrame(shard, h, frame);
      return Status::Ok();
    case wire::Opcode::kError: {
      auto err = wire::DecodeBody<wire::Error>(h, frame);
      TLOG_WARN("ps task {}: {}", shard, err.ok() ? err->message : "malformed error");
      return Status::Ok();
    }
    default:
      return Status::InvalidArgument(std::string("unexpected ") + wire::OpcodeName(h.opcode) +
                                     " from a ps task");
  }
}

void Service::OnLocalShardFrame(std::span<const uint8_t> frame) {
  if (stopped_) return;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) return;
  Status st = OnShardFrame(0, options_.local_shard, *h, frame);
  if (!st.ok()) TLOG_ERROR("ps task {}: {}", options_.local_shard, st.message());
}

void Service::OnLocalSteps(const wire::StepsApplied& report) {
  if (stopped_) return;
  Status st = OnStepsApplied(options_.local_shard, report);
  if (!st.ok()) TLOG_ERROR("{}", st.message());
}

Status Service::OnStepsApplied(int shard, const wire::StepsApplied& report) {
  Status st = coord_.OnStepsApplied(shard, report);
  if (!st.ok()) return st.WithContext("ps task " + std::to_string(shard) + "'s step report");
  global_step_ = coord_.global_step();
  if (checkpointer_) checkpointer_->OnGlobalStep(coord_.global_step());
  return Status::Ok();
}

void Service::OnPeerGone(PeerId peer) {
  for (size_t k = 0; k < links_.size(); ++k) {
    if (links_[k] != peer || peer == 0) continue;
    links_[k] = 0;
    if (checkpointer_) checkpointer_->OnShardLost(static_cast<int>(k));
  }
  std::erase_if(init_waiters_, [&](const auto& w) { return w.first == peer; });
  joins_.Forget(peer);
  held_.Forget(peer);
}

}  // namespace tessera::coord
