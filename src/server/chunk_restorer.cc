#include "server/chunk_restorer.h"

#include <algorithm>
#include <vector>

#include "core/dtype.h"
#include "core/log.h"
#include "kernels/update.h"

namespace tessera::server {

Result<std::unique_ptr<ChunkRestorer>> ChunkRestorer::Open(const std::string& path, uint64_t step,
                                                           const ckpt::OpenOptions& options) {
  auto c = ckpt::Checkpoint::Open(path, options);
  if (!c.ok()) return c.status();
  return std::unique_ptr<ChunkRestorer>(new ChunkRestorer(std::move(*c), step));
}

bool ChunkRestorer::Restore(Param& p, const apply::Target& target) {
  const auto& t = p.entry.tensor;
  const ckpt::TensorRecord* rec = checkpoint_.Find(t.name);
  if (rec == nullptr) return false;
  if (rec->dtype != t.dtype || rec->shape != t.shape) {
    TLOG_WARN("'{}' is {} in {} but is now declared {}: not restored (the chief initialises it)",
              t.name, DescribeTensor(rec->dtype, rec->shape), checkpoint_.path,
              DescribeTensor(t.dtype, t.shape));
    return false;
  }
  Status st = ReadSlots(p, *rec, target);
  if (st.ok()) st = apply::Publish(target, p);
  if (!st.ok()) {
    TLOG_ERROR("'{}' not restored: {}", p.display_name, st.message());
    Status zeroed = target.memory->Zero(p.data, p.bytes);
    if (zeroed.ok()) zeroed = apply::Publish(target, p);
    if (!zeroed.ok()) TLOG_ERROR("'{}': {}", p.display_name, zeroed.message());
    return false;
  }
  Resumed(p, *rec, target);
  return true;
}

Status ChunkRestorer::ReadSlots(Param& p, const ckpt::TensorRecord& rec,
                                const apply::Target& target) {
  const auto& t = p.entry.tensor;
  const uint64_t first = p.entry.elem_offset;
  // Reads a slot into the shard's memory: directly into host memory, through
  // a host buffer into a GPU's.
  std::vector<uint8_t> host;
  auto read = [&](ckpt::Slot slot, uint64_t offset, uint64_t bytes, uint8_t* dst) -> Status {
    if (target.host) return checkpoint_.ReadSlot(t.name, slot, offset, bytes, dst);
    host.resize(bytes);
    TESSERA_RETURN_IF_ERROR(checkpoint_.ReadSlot(t.name, slot, offset, bytes, host.data()));
    return target.memory->FromHost(dst, host.data(), bytes);
  };
  TESSERA_RETURN_IF_ERROR(read(ckpt::Slot::kParam, first * DTypeSize(t.dtype), p.bytes, p.data));
  if (rec.rule != t.rule) return Status::Ok();  // its state starts afresh (Resumed)
  const uint64_t ssize = kernels::StateElementSize(t.dtype);
  if (!p.state0.empty()) {
    TESSERA_RETURN_IF_ERROR(
        read(ckpt::Slot::kState0, first * ssize, p.state0.size(), p.state0.data()));
  }
  if (!p.state1.empty()) {
    TESSERA_RETURN_IF_ERROR(
        read(ckpt::Slot::kState1, first * ssize, p.state1.size(), p.state1.data()));
  }
  if (!p.master.empty()) {
    TESSERA_RETURN_IF_ERROR(read(ckpt::Slot::kMaster, first * 4, p.master.size(), p.master.data()));
  }
  return Status::Ok();
}

void ChunkRestorer::Resumed(Param& p, const ckpt::TensorRecord& rec, const apply::Target& target) {
  const auto& t = p.entry.tensor;
  if (rec.rule == t.rule) {
    p.updates = rec.updates;
  } else {
    TLOG_WARN(
        "'{}' was saved with rule {} and is now declared with {}: its value is restored, "
        "its optimizer state starts afresh",
        t.name, UpdateRuleName(rec.rule), UpdateRuleName(t.rule));
    if (Status reset = target.memory->ResetRuleState(t.rule, p.hyper, t.dtype, p.data,
                                                     p.entry.elem_count, p.rule_state());
        !reset.ok()) {
      TLOG_ERROR("'{}': optimizer state not reset: {}", p.display_name, reset.message());
    }
    p.updates = 0;
  }
  p.version = 1;
  p.initialized = true;
  if (t.mode.kind == Consistency::kSync) {
    p.step = step_;
    p.resume_at_first_push = true;
    p.resuming = true;
  }
  std::fill(p.pushed_steps.begin(), p.pushed_steps.end(), step_);
}

}  // namespace tessera::server
