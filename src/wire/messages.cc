#include "wire/messages.h"

#include <cstring>

namespace tessera::wire {
namespace {

Status Truncated(const char* what) {
  return Status::InvalidArgument(std::string("truncated or oversized field '") + what + "'");
}

// Reads a count of items each at least `min_item_bytes` long, refusing counts
// the remaining bytes could not hold (so a lying count allocates nothing).
bool GetCount(ByteReader& r, size_t min_item_bytes, uint32_t* count) {
  if (!r.Get(count)) return false;
  return static_cast<uint64_t>(*count) * min_item_bytes <= r.remaining();
}

template <size_t N>
bool GetArray(ByteReader& r, std::array<uint8_t, N>* out) {
  std::span<const uint8_t> bytes;
  if (!r.GetBytes(N, &bytes)) return false;
  std::copy(bytes.begin(), bytes.end(), out->begin());
  return true;
}

void PutFloat(ByteWriter& w, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  w.Put(bits);
}

bool GetFloat(ByteReader& r, float* f) {
  uint32_t bits = 0;
  if (!r.Get(&bits)) return false;
  std::memcpy(f, &bits, 4);
  return true;
}

constexpr size_t kHyperBytes = 7 * 4 + 1;

void PutHyper(ByteWriter& w, const Hyperparams& h) {
  for (float f : {h.learning_rate, h.weight_decay, h.momentum, h.beta1, h.beta2, h.epsilon,
                  h.initial_accumulator}) {
    PutFloat(w, f);
  }
  w.Put(static_cast<uint8_t>(h.nesterov ? 1 : 0));
}

Result<Hyperparams> GetHyper(ByteReader& r) {
  Hyperparams h;
  uint8_t flags = 0;
  for (float* f : {&h.learning_rate, &h.weight_decay, &h.momentum, &h.beta1, &h.beta2, &h.epsilon,
                   &h.initial_accumulator}) {
    if (!GetFloat(r, f)) return Truncated("hyper-parameters");
  }
  if (!r.Get(&flags)) return Truncated("hyper-parameter flags");
  if (flags > 1) return Status::InvalidArgument("unknown hyper-parameter flags");
  h.nesterov = flags == 1;
  TESSERA_RETURN_IF_ERROR(h.Validate());
  return h;
}

void PutTensorDecl(ByteWriter& w, const TensorDecl& t) {
  w.PutString(t.name);
  w.Put(static_cast<uint8_t>(t.dtype));
  w.Put(static_cast<uint8_t>(t.rule));
  w.Put(static_cast<uint8_t>(t.shape.size()));
  for (int64_t d : t.shape) w.Put(d);
  w.Put(t.pinned_shard);
  PutHyper(w, t.hyper);
  w.Put(static_cast<uint8_t>(t.mode.kind));
  w.Put(t.mode.replicas_to_aggregate);
  w.Put(t.mode.total_num_replicas);
  w.Put(static_cast<uint8_t>(t.mode.average ? 1 : 0));
  w.Put(t.mode.staleness);
}

constexpr size_t kModeBytes = 1 + 4 + 4 + 1 + 4;
constexpr size_t kMinTensorDeclBytes = 4 + 1 + 1 + 1 + 4 + kHyperBytes + kModeBytes;

Result<TensorDecl> GetTensorDecl(ByteReader& r) {
  TensorDecl t;
  uint8_t dtype = 0, rule = 0, ndims = 0;
  if (!r.GetString(&t.name, kMaxNameLength)) return Truncated("name");
  if (t.name.empty()) return Status::InvalidArgument("empty tensor name");
  if (!r.Get(&dtype)) return Truncated("dtype");
  if (!IsValidDType(dtype)) {
    return Status::InvalidArgument("tensor '" + t.name + "': invalid dtype " +
                                   std::to_string(dtype));
  }
  t.dtype = static_cast<DType>(dtype);
  if (!r.Get(&rule)) return Truncated("rule");
  if (!IsValidUpdateRule(rule)) {
    return Status::InvalidArgument("tensor '" + t.name + "': invalid update rule " +
                                   std::to_string(rule));
  }
  t.rule = static_cast<UpdateRule>(rule);
  if (!r.Get(&ndims)) return Truncated("ndims");
  if (ndims > kMaxDims) {
    return Status::InvalidArgument("tensor '" + t.name + "': " + std::to_string(ndims) +
                                   " dimensions (at most " + std::to_string(kMaxDims) + ")");
  }
  for (uint8_t i = 0; i < ndims; ++i) {
    int64_t d = 0;
    if (!r.Get(&d)) return Truncated("shape");
    t.shape.push_back(d);
  }
  if (!r.Get(&t.pinned_shard)) return Truncated("pinned_shard");
  auto hyper = GetHyper(r);
  if (!hyper.ok()) return hyper.status().WithContext("tensor '" + t.name + "'");
  t.hyper = *hyper;
  uint8_t kind = 0, average = 0;
  if (!r.Get(&kind) || !r.Get(&t.mode.replicas_to_aggregate) ||
      !r.Get(&t.mode.total_num_replicas) || !r.Get(&average) || !r.Get(&t.mode.staleness)) {
    return Truncated("consistency mode");
  }
  if (average > 1) return Status::InvalidArgument("tensor '" + t.name + "': bad average flag");
  t.mode.kind = static_cast<Consistency>(kind);
  t.mode.average = average == 1;
  TESSERA_RETURN_IF_ERROR(ValidateTensorDecl(t));
  return t;
}

}  // namespace

Status ValidateTensorDecl(const TensorDecl& t) {
  if (t.name.empty() || t.name.size() > kMaxNameLength) {
    return Status::InvalidArgument("tensor name must have 1 to " + std::to_string(kMaxNameLength) +
                                   " bytes");
  }
  if (t.shape.size() > kMaxDims) {
    return Status::InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.shape.size()) +
                                   " dimensions (at most " + std::to_string(kMaxDims) + ")");
  }
  auto n = NumElements(t.shape);
  if (!n.ok()) return n.status().WithContext("tensor '" + t.name + "'");
  if (*n > kMaxTensorElements) {
    return Status::InvalidArgument("tensor '" + t.name + "' has " + std::to_string(*n) +
                                   " elements, over the limit of " +
                                   std::to_string(kMaxTensorElements));
  }
  TESSERA_RETURN_IF_ERROR(t.mode.Validate().WithContext("tensor '" + t.name + "'"));
  const bool integer = t.dtype == DType::kI32 || t.dtype == DType::kI64;
  if (t.mode.kind == Consistency::kSync && t.mode.average && integer) {
    return Status::InvalidArgument("tensor '" + t.name +
                                   "': averaging needs a floating dtype; sum instead");
  }
  if (IsOptimizer(t.rule) && integer) {
    return Status::InvalidArgument("tensor '" + t.name + "': rule " + UpdateRuleName(t.rule) +
                                   " needs a floating dtype, not " + DTypeName(t.dtype));
  }
  return Status::Ok();
}

void Hello::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint8_t>(role));
  w.Put(worker_rank);
  w.PutString(task);
  w.PutBytes(client_nonce);
  w.PutString(node_id);
  w.PutString(cluster);
}
Result<Hello> Hello::DecodeBody(ByteReader& r) {
  Hello m;
  uint8_t role = 0;
  if (!r.Get(&role)) return Truncated("role");
  if (role > static_cast<uint8_t>(PeerRole::kObserver))
    return Status::InvalidArgument("unknown role " + std::to_string(role));
  m.role = static_cast<PeerRole>(role);
  if (!r.Get(&m.worker_rank)) return Truncated("worker_rank");
  if (!r.GetString(&m.task, kMaxNameLength)) return Truncated("task");
  if (!GetArray(r, &m.client_nonce)) return Truncated("client_nonce");
  if (!r.GetString(&m.node_id, 64)) return Truncated("node_id");
  if (!r.GetString(&m.cluster, kMaxClusterSpecLength)) return Truncated("cluster");
  return m;
}

void Challenge::EncodeBody(ByteWriter& w) const {
  w.PutBytes(server_nonce);
  w.Put(shard_index);
}
Result<Challenge> Challenge::DecodeBody(ByteReader& r) {
  Challenge m;
  if (!GetArray(r, &m.server_nonce)) return Truncated("server_nonce");
  if (!r.Get(&m.shard_index)) return Truncated("shard_index");
  return m;
}

void Auth::EncodeBody(ByteWriter& w) const { w.PutBytes(client_proof); }
Result<Auth> Auth::DecodeBody(ByteReader& r) {
  Auth m;
  if (!GetArray(r, &m.client_proof)) return Truncated("client_proof");
  return m;
}

namespace {

// An IPC handle: empty, or exactly kIpcHandleBytes.
bool GetIpcHandle(ByteReader& r, std::vector<uint8_t>* out) {
  std::span<const uint8_t> blob;
  if (!r.GetBlob(&blob, kIpcHandleBytes)) return false;
  if (!blob.empty() && blob.size() != kIpcHandleBytes) return false;
  out->assign(blob.begin(), blob.end());
  return true;
}

}  // namespace

void Welcome::EncodeBody(ByteWriter& w) const {
  w.PutBytes(server_proof);
  w.PutBlob(staging_region);
  w.PutBlob(staging_ipc);
}
Result<Welcome> Welcome::DecodeBody(ByteReader& r) {
  Welcome m;
  if (!GetArray(r, &m.server_proof)) return Truncated("server_proof");
  std::span<const uint8_t> blob;
  if (!r.GetBlob(&blob, kMaxRegionDescription)) return Truncated("staging_region");
  m.staging_region.assign(blob.begin(), blob.end());
  if (!GetIpcHandle(r, &m.staging_ipc)) return Truncated("staging_ipc");
  return m;
}

void Declare::EncodeBody(ByteWriter& w) const {
  w.Put(chunk_bytes);
  w.Put(placement);
  w.Put(static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) PutTensorDecl(w, t);
}
Result<Declare> Declare::DecodeBody(ByteReader& r) {
  Declare m;
  uint32_t count = 0;
  if (!r.Get(&m.chunk_bytes)) return Truncated("chunk_bytes");
  if (m.chunk_bytes < 8)
    return Status::InvalidArgument("chunk_bytes " + std::to_string(m.chunk_bytes) + " is below 8");
  if (!r.Get(&m.placement)) return Truncated("placement");
  if (m.placement < 1 || m.placement > 2)
    return Status::InvalidArgument("invalid placement policy " + std::to_string(m.placement));
  if (!GetCount(r, kMinTensorDeclBytes, &count)) return Truncated("tensor count");
  m.tensors.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto t = GetTensorDecl(r);
    if (!t.ok()) return t.status();
    m.tensors.push_back(std::move(*t));
  }
  return m;
}

void DeclareReply::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint32_t>(tensors.size()));
  for (const auto& chunks : tensors) {
    w.Put(static_cast<uint32_t>(chunks.size()));
    for (const auto& c : chunks) {
      w.Put(c.shard);
      w.Put(c.elem_offset);
      w.Put(c.elem_count);
    }
  }
  for (const auto* flags : {&initialized, &restored}) {
    w.Put(static_cast<uint32_t>(flags->size()));
    for (uint8_t b : *flags) w.Put(b);
  }
  w.Put(restored_step);
  w.Put(static_cast<uint32_t>(hyper.size()));
  for (const auto& h : hyper) PutHyper(w, h);
}
Result<DeclareReply> DeclareReply::DecodeBody(ByteReader& r) {
  DeclareReply m;
  uint32_t count = 0;
  if (!GetCount(r, 4, &count)) return Truncated("tensor count");
  m.tensors.resize(count);
  for (auto& chunks : m.tensors) {
    uint32_t n = 0;
    if (!GetCount(r, 20, &n)) return Truncated("chunk count");
    if (n == 0) return Status::InvalidArgument("a tensor with no chunks");
    chunks.resize(n);
    for (auto& c : chunks) {
      if (!r.Get(&c.shard) || !r.Get(&c.elem_offset) || !r.Get(&c.elem_count))
        return Truncated("chunk");
    }
  }
  for (auto* flags : {&m.initialized, &m.restored}) {
    uint32_t n = 0;
    if (!GetCount(r, 1, &n)) return Truncated("flag count");
    if (n != 0 && n != m.tensors.size())
      return Status::InvalidArgument("per-tensor flags do not match the tensors");
    flags->resize(n);
    for (auto& b : *flags) {
      if (!r.Get(&b) || b > 1) return Status::InvalidArgument("bad per-tensor flag");
    }
  }
  if (!r.Get(&m.restored_step)) return Truncated("restored_step");
  uint32_t n = 0;
  if (!GetCount(r, kHyperBytes, &n)) return Truncated("hyper-parameter count");
  if (n != 0 && n != m.tensors.size())
    return Status::InvalidArgument("per-tensor hyper-parameters do not match the tensors");
  m.hyper.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    auto h = GetHyper(r);
    if (!h.ok()) return h.status();
    m.hyper.push_back(*h);
  }
  return m;
}

void UpdateHyper::EncodeBody(ByteWriter& w) const {
  w.PutString(name);
  PutHyper(w, hyper);
}
Result<UpdateHyper> UpdateHyper::DecodeBody(ByteReader& r) {
  UpdateHyper m;
  if (!r.GetString(&m.name, kMaxNameLength)) return Truncated("name");
  auto h = GetHyper(r);
  if (!h.ok()) return h.status();
  m.hyper = *h;
  return m;
}

void Create::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) {
    PutTensorDecl(w, e.tensor);
    w.Put(e.chunk_index);
    w.Put(e.num_chunks);
    w.Put(e.elem_offset);
    w.Put(e.elem_count);
  }
}
Result<Create> Create::DecodeBody(ByteReader& r) {
  Create m;
  uint32_t count = 0;
  if (!GetCount(r, kMinTensorDeclBytes + 24, &count)) return Truncated("entry count");
  m.entries.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    CreateEntry e;
    auto t = GetTensorDecl(r);
    if (!t.ok()) return t.status();
    e.tensor = std::move(*t);
    if (!r.Get(&e.chunk_index) || !r.Get(&e.num_chunks) || !r.Get(&e.elem_offset) ||
        !r.Get(&e.elem_count)) {
      return Truncated("chunk");
    }
    uint64_t total = NumElements(e.tensor.shape).value();
    if (e.num_chunks == 0 || e.chunk_index >= e.num_chunks || e.elem_offset > total ||
        e.elem_count > total - e.elem_offset || (e.elem_count == 0 && total != 0)) {
      return Status::InvalidArgument(
          "tensor '" + e.tensor.name + "': chunk " + std::to_string(e.chunk_index) + "/" +
          std::to_string(e.num_chunks) + " [" + std::to_string(e.elem_offset) + ", +" +
          std::to_string(e.elem_count) + ") does not fit its shape");
    }
    m.entries.push_back(std::move(e));
  }
  return m;
}

void CreateReply::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    w.Put(k.key_id);
    w.Put(k.arena_id);
    w.Put(k.arena_offset);
    w.Put(k.byte_length);
    w.Put(k.version);
  }
  w.Put(static_cast<uint32_t>(arenas.size()));
  for (const auto& a : arenas) {
    w.Put(a.arena_id);
    w.PutBlob(a.region);
    w.PutBlob(a.ipc);
  }
}
Result<CreateReply> CreateReply::DecodeBody(ByteReader& r) {
  CreateReply m;
  uint32_t count = 0;
  if (!GetCount(r, 32, &count)) return Truncated("key count");
  m.keys.resize(count);
  for (auto& k : m.keys) {
    if (!r.Get(&k.key_id) || !r.Get(&k.arena_id) || !r.Get(&k.arena_offset) ||
        !r.Get(&k.byte_length) || !r.Get(&k.version)) {
      return Truncated("key");
    }
  }
  if (!GetCount(r, 8, &count)) return Truncated("arena count");
  m.arenas.resize(count);
  for (auto& a : m.arenas) {
    std::span<const uint8_t> blob;
    if (!r.Get(&a.arena_id) || !r.GetBlob(&blob, kMaxRegionDescription)) return Truncated("arena");
    a.region.assign(blob.begin(), blob.end());
    if (!GetIpcHandle(r, &a.ipc)) return Truncated("arena ipc handle");
  }
  return m;
}

void Push::EncodeBody(ByteWriter& w) const {
  w.Put(step);
  w.Put(step_parts);
  w.Put(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) {
    w.Put(e.key_id);
    w.Put(e.staging_offset);
    w.Put(e.byte_length);
  }
  w.PutBlob(payload);
}
Result<Push> Push::DecodeBody(ByteReader& r) {
  Push m;
  uint32_t count = 0;
  if (!r.Get(&m.step) || !r.Get(&m.step_parts)) return Truncated("step");
  if (!GetCount(r, 20, &count)) return Truncated("entry count");
  if (count == 0) return Status::InvalidArgument("push of no tensors");
  m.entries.resize(count);
  for (auto& e : m.entries) {
    if (!r.Get(&e.key_id) || !r.Get(&e.staging_offset) || !r.Get(&e.byte_length))
      return Truncated("entry");
  }
  std::span<const uint8_t> payload;
  if (!r.GetBlob(&payload, kMaxInlineBytes)) return Truncated("payload");
  m.payload.assign(payload.begin(), payload.end());
  return m;
}

namespace {
void PutVersions(ByteWriter& w, const std::vector<uint64_t>& v) {
  w.Put(static_cast<uint32_t>(v.size()));
  for (uint64_t x : v) w.Put(x);
}
bool GetVersions(ByteReader& r, std::vector<uint64_t>* v) {
  uint32_t count = 0;
  if (!GetCount(r, 8, &count)) return false;
  v->resize(count);
  for (auto& x : *v) {
    if (!r.Get(&x)) return false;
  }
  return true;
}
}  // namespace

void PushReply::EncodeBody(ByteWriter& w) const {
  PutVersions(w, versions);
  w.PutBytes(outcomes);
}
Result<PushReply> PushReply::DecodeBody(ByteReader& r) {
  PushReply m;
  if (!GetVersions(r, &m.versions)) return Truncated("versions");
  std::span<const uint8_t> outcomes;
  if (!r.GetBytes(m.versions.size(), &outcomes)) return Truncated("outcomes");
  for (uint8_t o : outcomes) {
    if (o > static_cast<uint8_t>(PushOutcome::kDuplicate)) {
      return Status::InvalidArgument("unknown push outcome " + std::to_string(o));
    }
  }
  m.outcomes.assign(outcomes.begin(), outcomes.end());
  return m;
}

void Pull::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) {
    w.Put(e.key_id);
    w.Put(e.min_version);
    w.Put(e.min_step);
  }
  w.Put(inline_max);
  w.Put(wait_ms);
}
Result<Pull> Pull::DecodeBody(ByteReader& r) {
  Pull m;
  uint32_t count = 0;
  if (!GetCount(r, 20, &count)) return Truncated("entry count");
  if (count == 0) return Status::InvalidArgument("pull of no tensors");
  m.entries.resize(count);
  for (auto& e : m.entries) {
    if (!r.Get(&e.key_id) || !r.Get(&e.min_version) || !r.Get(&e.min_step)) {
      return Truncated("entry");
    }
  }
  if (!r.Get(&m.inline_max)) return Truncated("inline_max");
  if (!r.Get(&m.wait_ms)) return Truncated("wait_ms");
  return m;
}

void PullReply::EncodeBody(ByteWriter& w) const {
  w.Put(lease_id);
  PutVersions(w, versions);
  w.PutBlob(data);
}
Result<PullReply> PullReply::DecodeBody(ByteReader& r) {
  PullReply m;
  if (!r.Get(&m.lease_id)) return Truncated("lease_id");
  if (!GetVersions(r, &m.versions)) return Truncated("versions");
  std::span<const uint8_t> data;
  if (!r.GetBlob(&data, kMaxInlineBytes)) return Truncated("data");
  m.data.assign(data.begin(), data.end());
  return m;
}

void Release::EncodeBody(ByteWriter& w) const { w.Put(lease_id); }
Result<Release> Release::DecodeBody(ByteReader& r) {
  Release m;
  if (!r.Get(&m.lease_id)) return Truncated("lease_id");
  return m;
}

void SetHyper::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint32_t>(key_ids.size()));
  for (uint32_t k : key_ids) w.Put(k);
  PutHyper(w, hyper);
}
Result<SetHyper> SetHyper::DecodeBody(ByteReader& r) {
  SetHyper m;
  uint32_t count = 0;
  if (!GetCount(r, 4, &count)) return Truncated("key count");
  if (count == 0) return Status::InvalidArgument("set-hyper for no tensors");
  m.key_ids.resize(count);
  for (auto& k : m.key_ids) {
    if (!r.Get(&k)) return Truncated("key id");
  }
  auto h = GetHyper(r);
  if (!h.ok()) return h.status();
  m.hyper = *h;
  return m;
}

void StepsApplied::EncodeBody(ByteWriter& w) const {
  w.Put(async_steps);
  w.Put(sync_step);
  w.Put(static_cast<uint32_t>(sync_workers.size()));
  for (const auto& worker : sync_workers) {
    w.Put(worker.rank);
    w.Put(worker.parts);
  }
}
Result<StepsApplied> StepsApplied::DecodeBody(ByteReader& r) {
  StepsApplied m;
  uint32_t count = 0;
  if (!r.Get(&m.async_steps) || !r.Get(&m.sync_step)) return Truncated("steps");
  if (!GetCount(r, 8, &count)) return Truncated("worker count");
  m.sync_workers.resize(count);
  for (auto& worker : m.sync_workers) {
    if (!r.Get(&worker.rank) || !r.Get(&worker.parts)) return Truncated("worker");
  }
  return m;
}

void StepReply::EncodeBody(ByteWriter& w) const { w.Put(global_step); }
Result<StepReply> StepReply::DecodeBody(ByteReader& r) {
  StepReply m;
  if (!r.Get(&m.global_step)) return Truncated("global_step");
  return m;
}

void JoinReply::EncodeBody(ByteWriter& w) const {
  w.PutString(restore_path);
  w.Put(global_step);
}
Result<JoinReply> JoinReply::DecodeBody(ByteReader& r) {
  JoinReply m;
  if (!r.GetString(&m.restore_path, kMaxPathLength)) return Truncated("restore_path");
  if (!r.Get(&m.global_step)) return Truncated("global_step");
  return m;
}

Result<CkptPrepare> CkptPrepare::DecodeBody(ByteReader& r) {
  CkptPrepare m;
  if (!r.Get(&m.round)) return Truncated("round");
  return m;
}

void CkptPrepared::EncodeBody(ByteWriter& w) const {
  w.Put(round);
  w.Put(static_cast<uint8_t>(has_sync ? 1 : 0));
  w.Put(min_step);
  w.Put(max_step);
  w.Put(chunks);
}
Result<CkptPrepared> CkptPrepared::DecodeBody(ByteReader& r) {
  CkptPrepared m;
  uint8_t has_sync = 0;
  if (!r.Get(&m.round) || !r.Get(&has_sync) || !r.Get(&m.min_step) || !r.Get(&m.max_step) ||
      !r.Get(&m.chunks)) {
    return Truncated("checkpoint-prepared");
  }
  if (has_sync > 1) return Status::InvalidArgument("bad has_sync flag");
  m.has_sync = has_sync == 1;
  if (m.min_step > m.max_step) return Status::InvalidArgument("min_step above max_step");
  return m;
}

void CkptWrite::EncodeBody(ByteWriter& w) const {
  w.Put(round);
  w.Put(step);
  w.PutString(dir);
  w.Put(static_cast<uint32_t>(files.size()));
  for (const auto& f : files) w.PutString(f);
  w.Put(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) {
    w.PutString(e.name);
    w.Put(e.chunk_index);
    w.Put(e.slot);
    w.Put(e.file);
    w.Put(e.offset);
    w.Put(e.bytes);
  }
}
Result<CkptWrite> CkptWrite::DecodeBody(ByteReader& r) {
  CkptWrite m;
  if (!r.Get(&m.round) || !r.Get(&m.step)) return Truncated("round");
  if (!r.GetString(&m.dir, kMaxPathLength) || m.dir.empty()) return Truncated("dir");
  uint32_t nfiles = 0;
  if (!GetCount(r, 4, &nfiles)) return Truncated("file count");
  m.files.resize(nfiles);
  for (auto& f : m.files) {
    if (!r.GetString(&f, kMaxNameLength)) return Truncated("file name");
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.')
      return Status::InvalidArgument("file name '" + f + "' is not a plain name");
  }
  uint32_t n = 0;
  if (!GetCount(r, 4 + 4 + 1 + 4 + 8 + 8, &n)) return Truncated("entry count");
  m.entries.resize(n);
  for (auto& e : m.entries) {
    if (!r.GetString(&e.name, kMaxNameLength) || !r.Get(&e.chunk_index) || !r.Get(&e.slot) ||
        !r.Get(&e.file) || !r.Get(&e.offset) || !r.Get(&e.bytes)) {
      return Truncated("entry");
    }
    if (e.slot > 3) return Status::InvalidArgument("unknown slot " + std::to_string(e.slot));
    if (e.file >= nfiles)
      return Status::InvalidArgument("entry names file " + std::to_string(e.file));
  }
  return m;
}

void CkptWritten::EncodeBody(ByteWriter& w) const {
  w.Put(round);
  w.Put(static_cast<uint8_t>(code));
  w.PutString(message);
  w.Put(static_cast<uint32_t>(updates.size()));
  for (uint64_t u : updates) w.Put(u);
}
Result<CkptWritten> CkptWritten::DecodeBody(ByteReader& r) {
  CkptWritten m;
  uint8_t code = 0;
  if (!r.Get(&m.round) || !r.Get(&code)) return Truncated("round");
  if (code > static_cast<uint8_t>(StatusCode::kInternal))
    return Status::InvalidArgument("invalid status code " + std::to_string(code));
  m.code = static_cast<StatusCode>(code);
  if (!r.GetString(&m.message, kMaxErrorMessage)) return Truncated("message");
  uint32_t n = 0;
  if (!GetCount(r, 8, &n)) return Truncated("update count");
  m.updates.resize(n);
  for (auto& u : m.updates) {
    if (!r.Get(&u)) return Truncated("updates");
  }
  return m;
}

Result<CkptAbort> CkptAbort::DecodeBody(ByteReader& r) {
  CkptAbort m;
  if (!r.Get(&m.round)) return Truncated("round");
  return m;
}

void CheckpointSaved::EncodeBody(ByteWriter& w) const {
  w.Put(global_step);
  w.PutString(path);
}
Result<CheckpointSaved> CheckpointSaved::DecodeBody(ByteReader& r) {
  CheckpointSaved m;
  if (!r.Get(&m.global_step)) return Truncated("global_step");
  if (!r.GetString(&m.path, kMaxPathLength)) return Truncated("path");
  return m;
}

void StatusReply::EncodeBody(ByteWriter& w) const { w.PutString(json); }
Result<StatusReply> StatusReply::DecodeBody(ByteReader& r) {
  StatusReply m;
  if (!r.GetString(&m.json, 1u << 20)) return Truncated("json");
  return m;
}

void Error::EncodeBody(ByteWriter& w) const {
  w.Put(static_cast<uint8_t>(code));
  w.PutString(message);
}
Result<Error> Error::DecodeBody(ByteReader& r) {
  Error m;
  uint8_t code = 0;
  if (!r.Get(&code)) return Truncated("code");
  if (code == 0 || code > static_cast<uint8_t>(StatusCode::kInternal)) {
    return Status::InvalidArgument("invalid status code " + std::to_string(code));
  }
  m.code = static_cast<StatusCode>(code);
  if (!r.GetString(&m.message, kMaxErrorMessage)) return Truncated("message");
  return m;
}

}  // namespace tessera::wire
