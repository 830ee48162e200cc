// A tensor's optimizer state read from and written to its shards, chunk by
// chunk, a range of at most wire::kMaxStateBytes at a time (get-state,
// set-state): what a trainer's state_dict() and load_state_dict() need.

#include <algorithm>
#include <cstring>

#include "client/client_impl.h"

namespace tessera {
namespace {

// Bytes of one element of a slot: the compute type of the moments, f32 for
// the master copy.
uint64_t SlotElementBytes(DType dtype, Client::StateSlot slot) {
  if (slot == Client::StateSlot::kMaster) return 4;
  return dtype == DType::kF64 ? 8 : 4;
}

}  // namespace

Result<Client::OptimizerState> Client::Impl::ReadOptimizerState(Tensor t, Client::StateSlot slot) {
  auto entry = tensors_.Lookup(t, 0, std::nullopt, /*check_bytes=*/false);
  if (!entry.ok()) return entry.status().WithContext("optimizer state");
  const client::TensorEntry& e = **entry;
  const uint64_t esz = SlotElementBytes(e.decl.dtype, slot);
  Client::OptimizerState out;
  for (const client::Chunk& c : e.chunks)
    out.bytes.resize(std::max<uint64_t>(out.bytes.size(), (c.elem_offset + c.elem_count) * esz));
  bool first = true;
  for (const client::Chunk& c : e.chunks) {
    const uint64_t bytes = c.elem_count * esz;
    for (uint64_t off = 0; off < bytes; off += wire::kMaxStateBytes) {
      const auto len = static_cast<uint32_t>(std::min<uint64_t>(wire::kMaxStateBytes, bytes - off));
      const client::Chunk* chunk = &c;
      auto reply = links_->CallMade<wire::StateReply>(
          c.shard,
          [chunk, slot, off, len] {
            return wire::GetState{chunk->key_id, static_cast<wire::StateSlotId>(slot), off, len};
          },
          options_.op_timeout);
      if (!reply.ok())
        return reply.status().WithContext("optimizer state of '" + e.decl.name + "'");
      if (reply->data.size() != len) {
        return Status::Internal("state reply of " + std::to_string(reply->data.size()) +
                                " bytes for " + std::to_string(len));
      }
      std::memcpy(out.bytes.data() + c.elem_offset * esz + off, reply->data.data(), len);
      if (first) out.updates = reply->updates;
      first = false;
    }
  }
  return out;
}

Status Client::Impl::WriteOptimizerState(Tensor t, Client::StateSlot slot,
                                         const Client::OptimizerState& state) {
  if (options_.read_only) return ReadOnlyRefusal("set optimizer state");
  if (worker_rank_ != 0) {
    return Status::FailedPrecondition(options_.task.ToString() +
                                      " is not the chief: only the chief sets optimizer state");
  }
  auto entry = tensors_.Lookup(t, 0, std::nullopt, /*check_bytes=*/false);
  if (!entry.ok()) return entry.status().WithContext("optimizer state");
  const client::TensorEntry& e = **entry;
  const uint64_t esz = SlotElementBytes(e.decl.dtype, slot);
  uint64_t total = 0;
  for (const client::Chunk& c : e.chunks) total += c.elem_count * esz;
  if (state.bytes.size() != total) {
    return Status::InvalidArgument("optimizer state of '" + e.decl.name +
                                   "': " + std::to_string(state.bytes.size()) +
                                   " bytes for a slot of " + std::to_string(total));
  }
  for (const client::Chunk& c : e.chunks) {
    const uint64_t bytes = c.elem_count * esz;
    for (uint64_t off = 0; off < bytes; off += wire::kMaxStateBytes) {
      const uint64_t len = std::min<uint64_t>(wire::kMaxStateBytes, bytes - off);
      const uint8_t* from = state.bytes.data() + c.elem_offset * esz + off;
      const client::Chunk* chunk = &c;
      auto done = links_->CallMade<wire::Ack>(
          c.shard,
          [chunk, slot, off, len, from, updates = state.updates] {
            wire::SetState m{chunk->key_id, static_cast<wire::StateSlotId>(slot), off, updates, {}};
            m.data.assign(from, from + len);
            return m;
          },
          options_.op_timeout);
      if (!done.ok()) return done.status().WithContext("optimizer state of '" + e.decl.name + "'");
    }
  }
  return Status::Ok();
}

}  // namespace tessera
