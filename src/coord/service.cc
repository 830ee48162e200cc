#include "coord/service.h"

#include <filesystem>

#include "core/log.h"

namespace tessera::coord {

Service::Service(ServiceOptions options, Host host)
    : options_(std::move(options)),
      host_(std::move(host)),
      coord_(options_.num_shards, options_.num_workers, options_.limits),
      links_(static_cast<size_t>(options_.num_shards), 0),
      joined_once_(static_cast<size_t>(options_.num_shards), false) {}

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
  host.on_saved = [this](const SavedCheckpoint&) { checkpoints_written_++; };
  host.on_failed = [this](Checkpointer::Reason reason, const Status& why) {
    std::lock_guard<std::mutex> lock(failure_mu_);
    last_checkpoint_failure_ =
        std::string(Checkpointer::ReasonName(reason)) + " checkpoint: " + why.message();
    checkpoint_rounds_failed_++;
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
  waiting_.clear();
  waiting_bytes_ = 0;
}

bool Service::Serves(wire::Opcode op) { return wire::AddressesCoordinator(op); }

bool Service::AllJoined() const {
  for (bool joined : joined_once_) {
    if (!joined) return false;
  }
  return true;
}

void Service::CheckReady() {
  if (!joins_answered_ && AllJoined()) {
    // The global step is rebuilt: the joins may hear where restored sync
    // chunks resume. (A restarted ps task 0 learns its own chunks back only
    // from the creates its answer lets in.)
    joins_answered_ = true;
    const wire::JoinReply answer = JoinAnswer();
    for (const auto& [shard, waiter] : join_waiters_) Reply(waiter.first, waiter.second, answer);
    join_waiters_.clear();
    if (local_join_waiter_) {
      auto waiter = std::move(local_join_waiter_);
      local_join_waiter_ = nullptr;
      waiter(answer);
    }
  }
  if (!ready_ && joins_answered_ && coord_.placement_known()) {
    ready_ = true;
    coord_.AdoptionDone();
    if (coord_.num_tensors() > 0) {
      TLOG_INFO("every ps task joined: {} tensors placed as before, global step {}{}",
                coord_.num_tensors(), coord_.global_step(),
                coord_.initialized() ? ", initialised" : "");
    }
  }
  while (ready_ && !waiting_.empty() && !stopped_) {
    Waiting w = std::move(waiting_.front());
    waiting_.pop_front();
    waiting_bytes_ -= w.frame.size();
    Serve(w.from, w.header, w.frame);
  }
}

void Service::SendError(PeerId peer, uint64_t request_id, const Status& st) {
  Reply(peer, request_id, wire::Error{st.code(), options_.name + ": " + st.message()});
}

void Service::OnWorkerRequest(const WorkerRef& from, const wire::Header& h,
                              std::span<const uint8_t> frame) {
  if (stopped_) return;
  if (ready_ && waiting_.empty()) return Serve(from, h, frame);
  // Held frames are the peers' bytes: bounded in number and in size.
  if (waiting_.size() >= options_.max_waiting_requests ||
      waiting_bytes_ + frame.size() > options_.max_waiting_bytes) {
    return SendError(from.peer, h.request_id,
                     Status::Unavailable("the coordinator is waiting for ps tasks to join, and " +
                                         std::to_string(waiting_.size()) + " requests (" +
                                         std::to_string(waiting_bytes_) + " bytes) wait already"));
  }
  if (waiting_.empty()) {
    std::string missing;
    for (size_t k = 0; k < joined_once_.size(); ++k) {
      if (!joined_once_[k]) missing += (missing.empty() ? "ps " : ", ps ") + std::to_string(k);
    }
    TLOG_INFO("{}'s {} waits until {}", from.task, wire::OpcodeName(h.opcode),
              missing.empty() ? "every tensor's chunks are known again"
                              : missing + " joined the coordinator");
  }
  waiting_bytes_ += frame.size();
  waiting_.push_back({from, h, CopyToMessage(frame)});
}

void Service::Serve(const WorkerRef& from, const wire::Header& h, std::span<const uint8_t> frame) {
  auto bad = [&](const Status& st) {
    SendError(from.peer, h.request_id,
              st.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
  };
  const bool reader_may = h.opcode == wire::Opcode::kDeclare ||
                          h.opcode == wire::Opcode::kGetStep || h.opcode == wire::Opcode::kWaitInit;
  if (from.reader && !reader_may) {
    return SendError(
        from.peer, h.request_id,
        Status::PermissionDenied(std::string(wire::OpcodeName(h.opcode)) + " from reader " +
                                 from.task + ", a read-only client"));
  }
  switch (h.opcode) {
    case wire::Opcode::kDeclare: {
      auto m = wire::DecodeBody<wire::Declare>(h, frame);
      if (!m.ok()) return bad(m.status());
      auto reply = from.reader ? coord_.Lookup(*m, from.task)
                               : coord_.Declare(*m, from.task, from.rank == 0);
      if (!reply.ok()) return SendError(from.peer, h.request_id, reply.status());
      return Reply(from.peer, h.request_id, *reply);
    }
    case wire::Opcode::kGetStep:
      return Reply(from.peer, h.request_id, wire::StepReply{coord_.global_step()});
    case wire::Opcode::kUpdateHyper: {
      if (from.rank != 0) {
        return SendError(from.peer, h.request_id,
                         Status::PermissionDenied(from.task + " is not the chief"));
      }
      auto m = wire::DecodeBody<wire::UpdateHyper>(h, frame);
      if (!m.ok()) return bad(m.status());
      Status st = coord_.UpdateHyper(*m);
      if (!st.ok()) return SendError(from.peer, h.request_id, st);
      return Reply(from.peer, h.request_id, wire::Ack{});
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
        return Reply(from.peer, h.request_id, wire::StepReply{coord_.StartStepForLateWorker()});
      }
      init_waiters_.emplace_back(from.peer, h.request_id);
      return;
    default:
      return SendError(from.peer, h.request_id,
                       Status::InvalidArgument(std::string(wire::OpcodeName(h.opcode)) +
                                               " is not a request to the coordinator"));
  }
}

void Service::OnInitDone(const WorkerRef& from, uint64_t request_id, const wire::InitDone& done) {
  if (from.rank != 0) {
    return SendError(from.peer, request_id,
                     Status::PermissionDenied(from.task + " is not the chief"));
  }
  TLOG_INFO("chief {} initialised the parameters (sync tensors start at step {})", from.task,
            done.start_step);
  coord_.MarkInitialized(done.start_step);
  Reply(from.peer, request_id, wire::Ack{});
  // Those who waited get the chief's number itself: the global step may
  // have moved on since the chief read it (the shards' reports of earlier
  // steps arrive after the fact), and every worker must start where the
  // fresh tensors are.
  for (auto& [waiter, req] : init_waiters_) Reply(waiter, req, wire::StepReply{done.start_step});
  init_waiters_.clear();
}

void Service::OnSaveCheckpoint(const WorkerRef& from, uint64_t request_id) {
  if (!checkpointer_) {
    return SendError(from.peer, request_id,
                     Status::FailedPrecondition(
                         "checkpoints are off: start the coordinator with a checkpoint directory "
                         "(--checkpoint-dir)"));
  }
  // The worker may be gone when the round ends: the host drops frames to
  // connections it no longer has.
  checkpointer_->Save(Checkpointer::Reason::kRequest,
                      [this, peer = from.peer, request_id](Result<SavedCheckpoint> r) {
                        if (!r.ok()) return SendError(peer, request_id, r.status());
                        Reply(peer, request_id, wire::CheckpointSaved{r->global_step, r->path});
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
  joined_once_[static_cast<size_t>(shard)] = true;
  CheckReady();
  return Status::Ok();
}

wire::JoinReply Service::JoinAnswer() const {
  return {checkpointer_ ? checkpointer_->latest_path() : restore_path_, coord_.global_step()};
}

void Service::JoinLocal(const wire::Join& join,
                        std::function<void(const wire::JoinReply&)> answer) {
  local_join_waiter_ = std::move(answer);
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
      if (!joins_answered_) {
        join_waiters_[shard] = {from, h.request_id};
        return Status::Ok();
      }
      Reply(from, h.request_id, JoinAnswer());
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
  std::erase_if(join_waiters_, [&](const auto& w) { return w.second.first == peer; });
  std::erase_if(waiting_, [&](const Waiting& w) {
    if (w.from.peer != peer) return false;
    waiting_bytes_ -= w.frame.size();
    return true;
  });
}

}  // namespace tessera::coord
