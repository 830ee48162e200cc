#include "server/dense_cut.h"

#include "core/dtype.h"

namespace tessera::server {

Result<bool> DenseCut::Begin(CutRound* round) {
  Drop();
  round_ = round;
  if (Status laid = Lay(); !laid.ok()) {
    Drop();
    return laid;
  }
  std::vector<Param*> now;
  for (const auto& [key, idx] : entries_of_) {
    Param* p = table_.Find(key);
    if (p->entry.tensor.mode.kind == Consistency::kSync && p->step != round_->step) {
      if (p->step > round_->step) {
        Status past = Status::FailedPrecondition(
            "'" + p->display_name + "' is at step " + std::to_string(p->step) +
            ", past the round's step " + std::to_string(round_->step));
        Drop();
        return past;
      }
      behind_.insert(key);
      continue;
    }
    now.push_back(p);
  }
  for (Param* p : now) {
    if (Status st = Capture(*p); !st.ok()) {
      Drop();
      return st;
    }
  }
  return behind_.empty();
}

void DenseCut::StepApplied(Param& p) {
  if (round_ == nullptr || p.step != round_->step || behind_.erase(p.key_id) == 0) return;
  // This chunk just reached the round's step.
  if (Status st = Capture(p); !st.ok()) {
    Drop();
    return events_.failed(st);
  }
  if (behind_.empty()) {
    Drop();
    events_.captured();
  }
}

void DenseCut::Drop() {
  round_ = nullptr;
  entries_of_.clear();
  behind_.clear();
  update_index_.clear();
}

Status DenseCut::Lay() {
  auto& entries = round_->entries;
  round_->pieces.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const Param* p = table_.Find(e.name, e.chunk_index);
    const std::string what = "tensor '" + e.name + "' chunk " + std::to_string(e.chunk_index);
    if (p == nullptr) {
      return Status::NotFound(what + " is not on " + task_ + " (declared but never created here?)");
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
    round_->pieces[i].file = e.file;
    round_->pieces[i].offset = e.offset;
    entries_of_[p->key_id].push_back(i);
    if (slot == ckpt::Slot::kParam) {
      update_index_[i] = round_->updates.size();
      round_->updates.push_back(0);
    }
  }
  return Status::Ok();
}

Status DenseCut::Capture(Param& p) {
  for (size_t i : entries_of_[p.key_id]) {
    const auto& e = round_->entries[i];
    const uint8_t* src = nullptr;
    switch (static_cast<ckpt::Slot>(e.slot)) {
      case ckpt::Slot::kParam:
        src = p.data;
        round_->updates[update_index_[i]] = p.updates;
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
    auto& bytes = round_->pieces[i].bytes;
    bytes.resize(e.bytes);
    if (Status st = memory_.ToHost(bytes.data(), src, e.bytes); !st.ok()) {
      return st.WithContext("reading '" + p.display_name + "'");
    }
  }
  return Status::Ok();
}

}  // namespace tessera::server
