#include "server/checkpoint_participant.h"

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
      if (cutting_ && cutting_->round == m->round) DropRound();
      if (frozen_round_ == m->round) Unfreeze();
      return;
    }
    default:
      TLOG_WARN("unexpected {} from the coordinator", wire::OpcodeName(h->opcode));
  }
}

void CheckpointParticipant::TableCaptured() {
  if (cutting_ && --tables_behind_ == 0) StartWriter();
}

void CheckpointParticipant::TableFailed(const Status& why) {
  if (cutting_) Fail(cutting_->round, why);
}

void CheckpointParticipant::DropRound() {
  if (!cutting_) return;
  tables_.DropCut();
  cutting_.reset();
}

void CheckpointParticipant::Abandon() {
  DropRound();
  Unfreeze();
}

void CheckpointParticipant::Stop() {
  stopping_ = true;
  DropRound();
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

void CheckpointParticipant::OnWrite(wire::CkptWrite m) {
  JoinWriter();  // the last round's, long done
  DropRound();
  auto round = std::make_unique<CutRound>();
  round->round = m.round;
  round->step = m.step;
  round->dir = std::move(m.dir);
  round->files = std::move(m.files);
  round->entries = std::move(m.entries);
  cutting_ = std::move(round);
  auto later = tables_.BeginCut(cutting_.get());
  if (!later.ok()) return Fail(m.round, later.status());  // still frozen: one consistent cut
  tables_behind_ = *later;
  if (tables_behind_ == 0) StartWriter();
  // Resume; entries behind are copied as their steps apply.
  Unfreeze();
}

void CheckpointParticipant::StartWriter() {
  std::shared_ptr<CutRound> job = std::move(cutting_);
  tables_.DropCut();
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
  DropRound();
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
