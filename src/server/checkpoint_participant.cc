#include "server/checkpoint_participant.h"

#include <algorithm>

#include "core/dtype.h"
#include "core/log.h"

namespace tessera::server {

void CheckpointParticipant::OnFrame(std::span<const uint8_t> frame) {
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) return;
  switch (h->opcode) {
    case wire::Opcode::kCkptPrepare: {
      auto m = wire::DecodeBody<wire::CkptPrepare>(*h, frame);
      if (m.ok()) OnPrepare(*m);
      return;
    }
    case wire::Opcode::kCkptWrite: {
      auto m = wire::DecodeBody<wire::CkptWrite>(*h, frame);
      if (m.ok()) OnWrite(std::move(*m));
      return;
    }
    case wire::Opcode::kCkptAbort: {
      auto m = wire::DecodeBody<wire::CkptAbort>(*h, frame);
      if (!m.ok()) return;
      if (snapshot_ && snapshot_->round == m->round) snapshot_.reset();
      if (frozen_round_ == m->round) Unfreeze();
      return;
    }
    default:
      TLOG_WARN("unexpected {} from the coordinator", wire::OpcodeName(h->opcode));
  }
}

void CheckpointParticipant::StepApplied(Param& p) {
  if (snapshot_ && p.step == snapshot_->step && snapshot_->behind.erase(p.key_id) > 0) {
    // This chunk just reached the checkpoint's step.
    if (Capture(p) && snapshot_->behind.empty()) StartWriter();
  }
}

void CheckpointParticipant::Abandon() {
  snapshot_.reset();
  Unfreeze();
}

void CheckpointParticipant::Stop() {
  stopping_ = true;
  snapshot_.reset();
}

void CheckpointParticipant::OnPrepare(const wire::CkptPrepare& m) {
  frozen_ = true;
  frozen_round_ = m.round;
  wire::CkptPrepared reply;
  reply.round = m.round;
  tables_.ReportForPrepare(&reply);
  options_.send_to_coordinator(wire::Encode(reply, 0));
  ctx_.PostAfter(options_.round_timeout, [this, round = m.round] {
    if (stopping_ || !frozen_ || frozen_round_ != round) return;
    TLOG_WARN("checkpoint round {}: no word from the coordinator; resuming updates", round);
    Unfreeze();
  });
}

Status CheckpointParticipant::Lay(Snapshot& snap) const {
  snap.pieces.resize(snap.entries.size());
  for (size_t i = 0; i < snap.entries.size(); ++i) {
    const auto& e = snap.entries[i];
    const Param* p = table_.Find(e.name, e.chunk_index);
    const std::string what = "tensor '" + e.name + "' chunk " + std::to_string(e.chunk_index);
    if (p == nullptr) {
      return Status::NotFound(what + " is not on " + options_.task +
                              " (declared but never created here?)");
    }
    if (!p->initialized) return Status::FailedPrecondition(what + " is not initialised");
    const auto slot = static_cast<ckpt::Slot>(e.slot);
    const auto& t = p->entry.tensor;
    const uint64_t want = p->entry.elem_count * DTypeSize(ckpt::SlotDType(t.dtype, slot));
    const bool present = slot == ckpt::Slot::kParam ||
                         (slot == ckpt::Slot::kState0 && !p->state0.empty()) ||
                         (slot == ckpt::Slot::kState1 && !p->state1.empty()) ||
                         (slot == ckpt::Slot::kMaster && !p->master.empty());
    if (!present || e.bytes != want) {
      return Status::InvalidArgument(what + ": the round asks for " + std::to_string(e.bytes) +
                                     " bytes of a slot it does not have");
    }
    snap.pieces[i].file = e.file;
    snap.pieces[i].offset = e.offset;
    snap.entries_of[p->key_id].push_back(i);
    if (slot == ckpt::Slot::kParam) {
      snap.update_index[i] = snap.updates.size();
      snap.updates.push_back(0);
    }
  }
  return Status::Ok();
}

void CheckpointParticipant::OnWrite(wire::CkptWrite m) {
  JoinWriter();  // the last round's, long done
  Snapshot snap;
  snap.round = m.round;
  snap.step = m.step;
  snap.dir = std::move(m.dir);
  snap.files = std::move(m.files);
  snap.entries = std::move(m.entries);
  if (Status laid = Lay(snap); !laid.ok()) return Fail(m.round, laid);
  snapshot_ = std::move(snap);
  std::vector<Param*> now;
  for (const auto& [key, idx] : snapshot_->entries_of) {
    Param* p = table_.Find(key);
    if (p->entry.tensor.mode.kind == Consistency::kSync && p->step != snapshot_->step) {
      if (p->step > snapshot_->step) {
        return Fail(m.round, Status::FailedPrecondition(
                                 "'" + p->display_name + "' is at step " + std::to_string(p->step) +
                                 ", past the round's step " + std::to_string(snapshot_->step)));
      }
      snapshot_->behind.insert(key);
      continue;
    }
    now.push_back(p);
  }
  for (Param* p : now) {
    if (!Capture(*p)) return;  // still frozen: one consistent cut
  }
  if (snapshot_->behind.empty()) StartWriter();
  // Resume; chunks behind are captured as their steps apply (StepApplied).
  Unfreeze();
}

bool CheckpointParticipant::Capture(Param& p) {
  for (size_t i : snapshot_->entries_of[p.key_id]) {
    const auto& e = snapshot_->entries[i];
    const uint8_t* src = nullptr;
    switch (static_cast<ckpt::Slot>(e.slot)) {
      case ckpt::Slot::kParam:
        src = p.data;
        snapshot_->updates[snapshot_->update_index[i]] = p.updates;
        break;
      case ckpt::Slot::kState0:
        src = p.state0.data();
        break;
      case ckpt::Slot::kState1:
        src = p.state1.data();
        break;
      case ckpt::Slot::kMaster:
        src = p.master.data();
        break;
    }
    // From the shard's memory (a GPU's too) into the host bytes the writer
    // thread writes: the cut is taken here, while updates are held.
    auto& bytes = snapshot_->pieces[i].bytes;
    bytes.resize(e.bytes);
    if (Status st = memory_.ToHost(bytes.data(), src, e.bytes); !st.ok()) {
      Fail(snapshot_->round, st.WithContext("reading '" + p.display_name + "'"));
      return false;
    }
  }
  return true;
}

void CheckpointParticipant::StartWriter() {
  auto job = std::make_shared<Snapshot>(std::move(*snapshot_));
  snapshot_.reset();
  JoinWriter();
  // Files are written off the progress thread: training goes on meanwhile.
  writer_ = std::thread([this, job] {
    Status st = ckpt::WritePieces(job->dir, job->files, job->pieces);
    job->pieces.clear();
    ctx_.Post([this, job, st] {
      if (stopping_) return;
      wire::CkptWritten w{job->round, st.code(), st.message(), job->updates};
      options_.send_to_coordinator(wire::Encode(w, 0));
    });
  });
}

void CheckpointParticipant::Fail(uint64_t round, const Status& st) {
  TLOG_WARN("checkpoint round {}: {}", round, st.message());
  snapshot_.reset();
  options_.send_to_coordinator(
      wire::Encode(wire::CkptWritten{round, st.code(), st.message(), {}}, 0));
  Unfreeze();
}

void CheckpointParticipant::Unfreeze() {
  if (!frozen_) return;
  frozen_ = false;
  options_.resumed();
}

}  // namespace tessera::server
