// The handshake, declares and creates, errors and status: encode, and decode
// with every field checked. Pushes and pulls are in messages_data.cc, the
// coordinator's messages in messages_coord.cc.
#include <algorithm>
#include <cstring>

#include "wire/field_codec.h"
#include "wire/messages.h"

namespace tessera::wire {

using namespace field;  // this layer's own field codecs

bool HasControlCharacter(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

Status ValidateTensorDecl(const TensorDecl& t) {
  if (t.name.empty() || t.name.size() > kMaxNameLength) {
    return Status::InvalidArgument("tensor name must have 1 to " + std::to_string(kMaxNameLength) +
                                   " bytes");
  }
  if (HasControlCharacter(t.name)) {
    return Status::InvalidArgument(
        "a tensor name holds a control character (a newline, an escape...): refused");
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
  if (t.rule == UpdateRule::kFtrl) {
    return Status::InvalidArgument("tensor '" + t.name +
                                   "': rule ftrl is for embedding tables, not dense tensors");
  }
  if (IsOptimizer(t.rule) && integer) {
    return Status::InvalidArgument("tensor '" + t.name + "': rule " + UpdateRuleName(t.rule) +
                                   " needs a floating dtype, not " + DTypeName(t.dtype));
  }
  return Status::Ok();
}

void Hello::EncodeBody(MessageWriter& w) const {
  w.Put(static_cast<uint8_t>(role));
  w.Put(task_index);
  w.PutString(task);
  w.PutBytes(client_nonce);
  w.PutString(node_id);
  w.PutString(cluster);
  w.Put(static_cast<uint8_t>(protection));
}
Result<Hello> Hello::DecodeBody(ByteReader& r) {
  Hello m;
  uint8_t role = 0;
  if (!r.Get(&role)) return Truncated("role");
  if (role > static_cast<uint8_t>(PeerRole::kReader))
    return Status::InvalidArgument("unknown role " + std::to_string(role));
  m.role = static_cast<PeerRole>(role);
  if (!r.Get(&m.task_index)) return Truncated("task_index");
  if (!r.GetString(&m.task, kMaxNameLength)) return Truncated("task");
  if (HasControlCharacter(m.task)) {
    return Status::InvalidArgument("the task name holds a control character: refused");
  }
  if (!GetArray(r, &m.client_nonce)) return Truncated("client_nonce");
  if (!r.GetString(&m.node_id, 64)) return Truncated("node_id");
  if (HasControlCharacter(m.node_id)) {
    return Status::InvalidArgument("the node id holds a control character: refused");
  }
  if (!r.GetString(&m.cluster, kMaxClusterSpecLength)) return Truncated("cluster");
  uint8_t protection = 0;
  if (!r.Get(&protection)) return Truncated("protection");
  if (protection > static_cast<uint8_t>(SessionProtection::kIntegrity)) {
    return Status::InvalidArgument("unknown session protection " + std::to_string(protection));
  }
  m.protection = static_cast<SessionProtection>(protection);
  return m;
}

void Challenge::EncodeBody(MessageWriter& w) const {
  w.PutBytes(server_nonce);
  w.Put(shard_index);
}
Result<Challenge> Challenge::DecodeBody(ByteReader& r) {
  Challenge m;
  if (!GetArray(r, &m.server_nonce)) return Truncated("server_nonce");
  if (!r.Get(&m.shard_index)) return Truncated("shard_index");
  return m;
}

void Auth::EncodeBody(MessageWriter& w) const { w.PutBytes(client_proof); }
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

void Welcome::EncodeBody(MessageWriter& w) const {
  w.PutBytes(server_proof);
  w.PutBlob(staging_region);
  w.PutBlob(staging_ipc);
  w.Put(static_cast<uint8_t>(protection));
}
Result<Welcome> Welcome::DecodeBody(ByteReader& r) {
  Welcome m;
  if (!GetArray(r, &m.server_proof)) return Truncated("server_proof");
  std::span<const uint8_t> blob;
  if (!r.GetBlob(&blob, kMaxRegionDescription)) return Truncated("staging_region");
  m.staging_region.assign(blob.begin(), blob.end());
  if (!GetIpcHandle(r, &m.staging_ipc)) return Truncated("staging_ipc");
  uint8_t protect = 0;
  if (!r.Get(&protect)) return Truncated("protection");
  if (protect == static_cast<uint8_t>(SessionProtection::kAuto) ||
      protect > static_cast<uint8_t>(SessionProtection::kIntegrity)) {
    return Status::InvalidArgument("the welcome's session protection is " +
                                   std::to_string(protect));
  }
  m.protection = static_cast<SessionProtection>(protect);
  return m;
}

void Declare::EncodeBody(MessageWriter& w) const {
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

void DeclareReply::EncodeBody(MessageWriter& w) const {
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

void UpdateHyper::EncodeBody(MessageWriter& w) const {
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

void Create::EncodeBody(MessageWriter& w) const {
  w.Put(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) PutCreateEntry(w, e);
}
Result<Create> Create::DecodeBody(ByteReader& r) {
  Create m;
  uint32_t count = 0;
  if (!GetCount(r, kMinCreateEntryBytes, &count)) return Truncated("entry count");
  m.entries.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto e = GetCreateEntry(r);
    if (!e.ok()) return e.status();
    m.entries.push_back(std::move(*e));
  }
  return m;
}

void CreateReply::EncodeBody(MessageWriter& w) const {
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

void StatusReply::EncodeBody(MessageWriter& w) const { w.PutString(json); }
Result<StatusReply> StatusReply::DecodeBody(ByteReader& r) {
  StatusReply m;
  if (!r.GetString(&m.json, 1u << 20)) return Truncated("json");
  return m;
}

void Error::EncodeBody(MessageWriter& w) const {
  w.Put(static_cast<uint8_t>(code));
  w.PutString(message);
}
Result<Error> Error::DecodeBody(ByteReader& r) {
  Error m;
  uint8_t code = 0;
  if (!r.Get(&code)) return Truncated("code");
  if (code == 0 || code > static_cast<uint8_t>(StatusCode::kCancelled)) {
    return Status::InvalidArgument("invalid status code " + std::to_string(code));
  }
  m.code = static_cast<StatusCode>(code);
  if (!r.GetString(&m.message, kMaxErrorMessage)) return Truncated("message");
  return m;
}

}  // namespace tessera::wire
