#include "server/param_table.h"

#include <algorithm>

#include "gpu/cuda.h"

namespace tessera::server {
namespace {

constexpr uint64_t kAlignment = 64;  // cache line; also keeps every dtype aligned

std::string Describe(const wire::CreateEntry& e) {
  return DescribeTensor(e.tensor.dtype, e.tensor.shape) + " (rule " +
         UpdateRuleName(e.tensor.rule) + ")";
}

}  // namespace

Result<std::pair<uint32_t, uint64_t>> ParamTable::AllocateBytes(uint64_t bytes) {
  uint64_t need = std::max<uint64_t>(bytes, 1);
  for (uint32_t id = 0; id < arenas_.size(); ++id) {
    Arena& a = arenas_[id];
    uint64_t offset = (a.used + kAlignment - 1) / kAlignment * kAlignment;
    if (offset + need <= a.region->size()) {
      a.used = offset + need;
      return std::make_pair(id, offset);
    }
  }
  uint64_t size =
      std::max<uint64_t>(arena_bytes_, (need + kAlignment - 1) / kAlignment * kAlignment);
  Arena arena;
  arena.used = need;
  // Workers only ever read parameters.
  const auto access = transport::RemoteAccess::kRead;
  if (!memory_->is_host()) {
    // Plain cudaMalloc, so that a worker on this node can map it (CUDA IPC).
    auto values = memory_->Allocate(size);
    if (!values.ok()) {
      return values.status().WithContext("allocating a " + std::to_string(size) + "-byte arena");
    }
    arena.values = std::move(*values);
  }
  auto region =
      arena.values.empty() || staged()
          ? ctx_->Allocate(size, transport::MemoryKind::kHost, access)
          : ctx_->Register(arena.values.data(), size, transport::MemoryKind::kCuda, access);
  if (!region.ok()) {
    return region.status().WithContext("allocating a " + std::to_string(size) + "-byte arena");
  }
  arena.region = std::move(*region);
  arenas_.push_back(std::move(arena));
  return std::make_pair(static_cast<uint32_t>(arenas_.size() - 1), uint64_t{0});
}

Result<std::vector<uint8_t>> ParamTable::ArenaIpcHandle(uint32_t arena_id) {
  Arena& a = arenas_[arena_id];
  if (a.values.empty()) return Status::FailedPrecondition("host arenas have no CUDA IPC handle");
  if (a.ipc_handle.empty()) {
    auto h = gpu::ExportIpc(a.values.data());
    if (!h.ok()) return h.status();
    a.ipc_handle.assign(h->begin(), h->end());
  }
  return a.ipc_handle;
}

uint64_t ParamTable::FootprintOf(const wire::CreateEntry& entry) const {
  const auto& t = entry.tensor;
  uint64_t per_element = DTypeSize(t.dtype) * (staged() ? 2 : 1) +
                         kernels::StateSlots(t.rule) * kernels::StateElementSize(t.dtype);
  if (kernels::NeedsMaster(t.dtype, t.rule)) per_element += sizeof(float);
  if (t.mode.kind == Consistency::kSync) per_element += kernels::AccumulatorElementSize(t.dtype);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(entry.elem_count, per_element, &bytes)) return UINT64_MAX;
  return bytes;
}

Status ParamTable::CheckRoom(const std::vector<wire::CreateEntry>& entries, uint64_t budget,
                             uint64_t max_chunks) const {
  uint64_t held = held_bytes_;
  uint64_t chunks = params_.size();
  for (const auto& entry : entries) {
    if (by_name_.contains({entry.tensor.name, entry.chunk_index})) continue;
    const uint64_t need = FootprintOf(entry);
    if (++chunks > max_chunks) {
      return Status::ResourceExhausted("creating tensor '" + entry.tensor.name + "' chunk " +
                                       std::to_string(entry.chunk_index) + " would exceed the " +
                                       std::to_string(max_chunks) + " chunks a ps task holds");
    }
    if (need > budget || held > budget - need) {
      return Status::ResourceExhausted(
          "tensor '" + entry.tensor.name + "' (" +
          DescribeTensor(entry.tensor.dtype, entry.tensor.shape) + "), chunk " +
          std::to_string(entry.chunk_index) + " of " + std::to_string(entry.num_chunks) +
          ", needs " + std::to_string(need) + " bytes with its optimizer state; this ps task's " +
          memory_->Describe() + " holds " + std::to_string(held) + " of the " +
          std::to_string(budget) + " it may use (what was free at start)");
    }
    held += need;
  }
  return Status::Ok();
}

Result<Param*> ParamTable::Create(const wire::CreateEntry& entry) {
  const auto& t = entry.tensor;
  auto key = std::make_pair(t.name, entry.chunk_index);
  if (auto it = by_name_.find(key); it != by_name_.end()) {
    Param* p = params_[it->second].get();
    const auto& have = p->entry;
    if (have.tensor.dtype != t.dtype || have.tensor.shape != t.shape ||
        have.tensor.rule != t.rule || have.num_chunks != entry.num_chunks ||
        have.elem_offset != entry.elem_offset || have.elem_count != entry.elem_count) {
      return Status::AlreadyExists("tensor '" + t.name + "' is held as " + Describe(have) +
                                   " but was now declared as " + Describe(entry));
    }
    return p;
  }
  uint64_t bytes = entry.elem_count * DTypeSize(t.dtype);
  auto place = AllocateBytes(bytes);
  if (!place.ok()) return place.status().WithContext("tensor '" + t.name + "'");
  auto p = std::make_unique<Param>();
  p->key_id = static_cast<uint32_t>(params_.size());
  p->SetEntry(entry);
  p->display_name = entry.num_chunks == 1
                        ? t.name
                        : t.name + " (chunk " + std::to_string(entry.chunk_index) + " of " +
                              std::to_string(entry.num_chunks) + ")";
  p->arena_id = place->first;
  p->arena_offset = place->second;
  p->bytes = bytes;
  const Arena& arena = arenas_[place->first];
  p->published = static_cast<uint8_t*>(arena.region->data()) + place->second;
  p->data = arena.values.empty() ? p->published : arena.values.data() + place->second;
  auto zeroed = [&](size_t n, StateBuffer* out) -> Status {
    auto b = memory_->Allocate(n);
    if (!b.ok()) return b.status().WithContext("tensor '" + p->display_name + "'");
    *out = std::move(*b);
    return Status::Ok();
  };
  if (staged()) std::fill(p->published, p->published + bytes, uint8_t{0});
  TESSERA_RETURN_IF_ERROR(memory_->Zero(p->data, bytes));
  p->hyper = t.hyper;
  const size_t state_bytes = entry.elem_count * kernels::StateElementSize(t.dtype);
  const int slots = kernels::StateSlots(t.rule);
  if (slots >= 1) TESSERA_RETURN_IF_ERROR(zeroed(state_bytes, &p->state0));
  if (slots >= 2) TESSERA_RETURN_IF_ERROR(zeroed(state_bytes, &p->state1));
  if (kernels::NeedsMaster(t.dtype, t.rule)) {
    TESSERA_RETURN_IF_ERROR(zeroed(entry.elem_count * sizeof(float), &p->master));
  }
  if (t.mode.kind == Consistency::kSync) {
    TESSERA_RETURN_IF_ERROR(
        zeroed(entry.elem_count * kernels::AccumulatorElementSize(t.dtype), &p->agg));
    p->contributed.assign(static_cast<size_t>(num_workers_), false);
  }
  if (t.mode.kind == Consistency::kBounded) p->pushed_steps.assign(t.mode.total_num_replicas, 0);
  by_name_[key] = p->key_id;
  params_.push_back(std::move(p));
  held_bytes_ += FootprintOf(entry);
  return params_.back().get();
}

Param* ParamTable::Find(const std::string& name, uint32_t chunk_index) {
  auto it = by_name_.find({name, chunk_index});
  return it == by_name_.end() ? nullptr : params_[it->second].get();
}

void ParamTable::ReportForPrepare(wire::CkptPrepared* reply) const {
  for (const auto& p : params_) {
    if (!p->initialized) continue;
    reply->chunks++;
    if (p->entry.tensor.mode.kind != Consistency::kSync) continue;
    reply->min_step = reply->has_sync ? std::min(reply->min_step, p->step) : p->step;
    reply->max_step = reply->has_sync ? std::max(reply->max_step, p->step) : p->step;
    reply->has_sync = true;
  }
}

uint64_t ParamTable::SyncStepReached() const {
  uint64_t step = 0;
  for (const auto& p : params_) {
    if (p->initialized && p->entry.tensor.mode.kind == Consistency::kSync) {
      step = std::max(step, p->step);
    }
  }
  return step;
}

}  // namespace tessera::server
