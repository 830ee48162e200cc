// The data path's messages: push, pull, their replies, leases, hyper-parameters.
#include <cstring>

#include "wire/field_codec.h"
#include "wire/messages.h"

namespace tessera::wire {

using namespace field;  // this layer's own field codecs

void Push::EncodeBody(MessageWriter& w) const {
  w.Put(step);
  w.Put(step_parts);
  w.Put(static_cast<uint32_t>(entries.size()));
  FieldCursor out = w.Extend(entries.size() * kPushEntryBytes);
  for (const auto& e : entries) {
    out.Put(e.key_id);
    out.Put(e.staging_offset);
    out.Put(e.byte_length);
  }
  w.PutBlob(payload);
}
Result<Push> Push::DecodeBody(ByteReader& r) {
  Push m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status Push::DecodeBodyInto(ByteReader& r, Push* m) {
  uint32_t count = 0;
  if (!r.Get(&m->step) || !r.Get(&m->step_parts)) return Truncated("step");
  if (!GetCount(r, kPushEntryBytes, &count)) return Truncated("entry count");
  if (count == 0) return Status::InvalidArgument("push of no tensors");
  FieldReader in;
  if (!r.GetFields(size_t{count} * kPushEntryBytes, &in)) return Truncated("entry");
  m->entries.resize(count);
  for (auto& e : m->entries) {
    e.key_id = in.Get<uint32_t>();
    e.staging_offset = in.Get<uint64_t>();
    e.byte_length = in.Get<uint64_t>();
  }
  std::span<const uint8_t> payload;
  if (!r.GetBlob(&payload, kMaxInlineBytes)) return Truncated("payload");
  m->payload.assign(payload.begin(), payload.end());
  return Status::Ok();
}

namespace {
void PutVersions(MessageWriter& w, const std::vector<uint64_t>& v) {
  w.Put(static_cast<uint32_t>(v.size()));
  FieldCursor out = w.Extend(v.size() * 8);
  for (uint64_t x : v) out.Put(x);
}
bool GetVersions(ByteReader& r, std::vector<uint64_t>* v) {
  uint32_t count = 0;
  FieldReader in;
  if (!GetCount(r, 8, &count) || !r.GetFields(size_t{count} * 8, &in)) return false;
  v->resize(count);
  for (auto& x : *v) x = in.Get<uint64_t>();
  return true;
}
}  // namespace

void PushReply::EncodeBody(MessageWriter& w) const {
  PutVersions(w, versions);
  w.PutBytes(outcomes);
  w.Put(static_cast<uint32_t>(refusals.size()));
  for (const auto& r : refusals) {
    w.Put(r.index);
    w.Put(static_cast<uint8_t>(r.code));
    w.PutString(r.message);
  }
}
Result<PushReply> PushReply::DecodeBody(ByteReader& r) {
  PushReply m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status PushReply::DecodeBodyInto(ByteReader& r, PushReply* m) {
  if (!GetVersions(r, &m->versions)) return Truncated("versions");
  std::span<const uint8_t> outcomes;
  if (!r.GetBytes(m->versions.size(), &outcomes)) return Truncated("outcomes");
  size_t refused = 0;
  for (uint8_t o : outcomes) {
    if (o > static_cast<uint8_t>(PushOutcome::kRefused)) {
      return Status::InvalidArgument("unknown push outcome " + std::to_string(o));
    }
    refused += o == static_cast<uint8_t>(PushOutcome::kRefused);
  }
  m->outcomes.assign(outcomes.begin(), outcomes.end());
  return DecodeRefusals(r, refused, m);
}

// One refusal per kRefused outcome, each naming such an entry, in order.
Status PushReply::DecodeRefusals(ByteReader& r, size_t refused, PushReply* m) {
  uint32_t count = 0;
  if (!r.Get(&count)) return Truncated("refusals");
  if (count != refused) {
    return Status::InvalidArgument("push reply: " + std::to_string(count) + " refusals for " +
                                   std::to_string(refused) + " refused entries");
  }
  m->refusals.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    PushRefusal& f = m->refusals[i];
    uint8_t code = 0;
    if (!r.Get(&f.index) || !r.Get(&code)) return Truncated("refusal");
    if (f.index >= m->outcomes.size() ||
        m->outcomes[f.index] != static_cast<uint8_t>(PushOutcome::kRefused) ||
        (i > 0 && f.index <= m->refusals[i - 1].index)) {
      return Status::InvalidArgument("push reply: a refusal names entry " +
                                     std::to_string(f.index) + ", which was not refused");
    }
    if (code == 0 || code > static_cast<uint8_t>(StatusCode::kCancelled)) {
      return Status::InvalidArgument("invalid status code " + std::to_string(code));
    }
    f.code = static_cast<StatusCode>(code);
    if (!r.GetString(&f.message, kMaxErrorMessage)) return Truncated("refusal message");
  }
  return Status::Ok();
}

void Pull::EncodeBody(MessageWriter& w) const {
  w.Put(static_cast<uint32_t>(entries.size()));
  FieldCursor out = w.Extend(entries.size() * kPullEntryBytes);
  for (const auto& e : entries) {
    out.Put(e.key_id);
    out.Put(e.min_version);
    out.Put(e.min_step);
  }
  w.Put(inline_max);
  w.Put(wait_ms);
}
Result<Pull> Pull::DecodeBody(ByteReader& r) {
  Pull m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status Pull::DecodeBodyInto(ByteReader& r, Pull* m) {
  uint32_t count = 0;
  if (!GetCount(r, kPullEntryBytes, &count)) return Truncated("entry count");
  if (count == 0) return Status::InvalidArgument("pull of no tensors");
  FieldReader in;
  if (!r.GetFields(size_t{count} * kPullEntryBytes, &in)) return Truncated("entry");
  m->entries.resize(count);
  for (auto& e : m->entries) {
    e.key_id = in.Get<uint32_t>();
    e.min_version = in.Get<uint64_t>();
    e.min_step = in.Get<uint64_t>();
  }
  if (!r.Get(&m->inline_max)) return Truncated("inline_max");
  if (!r.Get(&m->wait_ms)) return Truncated("wait_ms");
  return Status::Ok();
}

void PullReply::EncodeBody(MessageWriter& w) const {
  w.Put(lease_id);
  PutVersions(w, versions);
  w.PutBlob(data);
}
Result<PullReply> PullReply::DecodeBody(ByteReader& r) {
  PullReply m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status PullReply::DecodeBodyInto(ByteReader& r, PullReply* m) {
  if (!r.Get(&m->lease_id)) return Truncated("lease_id");
  if (!GetVersions(r, &m->versions)) return Truncated("versions");
  std::span<const uint8_t> data;
  if (!r.GetBlob(&data, kMaxInlineBytes)) return Truncated("data");
  m->data.assign(data.begin(), data.end());
  return Status::Ok();
}

namespace {
Status GetSlot(ByteReader& r, StateSlotId* slot) {
  uint8_t raw = 0;
  if (!r.Get(&raw)) return Truncated("slot");
  if (raw > static_cast<uint8_t>(StateSlotId::kMaster)) {
    return Status::InvalidArgument("state slot " + std::to_string(raw) + " (0, 1 or 2)");
  }
  *slot = static_cast<StateSlotId>(raw);
  return Status::Ok();
}
}  // namespace

void GetState::EncodeBody(MessageWriter& w) const {
  w.Put(key_id);
  w.Put(static_cast<uint8_t>(slot));
  w.Put(offset);
  w.Put(length);
}
Result<GetState> GetState::DecodeBody(ByteReader& r) {
  GetState m;
  if (!r.Get(&m.key_id)) return Truncated("key id");
  TESSERA_RETURN_IF_ERROR(GetSlot(r, &m.slot));
  if (!r.Get(&m.offset)) return Truncated("offset");
  if (!r.Get(&m.length)) return Truncated("length");
  if (m.length == 0 || m.length > kMaxStateBytes) {
    return Status::InvalidArgument("get-state of " + std::to_string(m.length) + " bytes (1 to " +
                                   std::to_string(kMaxStateBytes) + ")");
  }
  return m;
}

void StateReply::EncodeBody(MessageWriter& w) const {
  w.Put(updates);
  w.PutBlob(data);
}
Result<StateReply> StateReply::DecodeBody(ByteReader& r) {
  StateReply m;
  if (!r.Get(&m.updates)) return Truncated("updates");
  std::span<const uint8_t> data;
  if (!r.GetBlob(&data, kMaxStateBytes)) return Truncated("data");
  m.data.assign(data.begin(), data.end());
  return m;
}

void SetState::EncodeBody(MessageWriter& w) const {
  w.Put(key_id);
  w.Put(static_cast<uint8_t>(slot));
  w.Put(offset);
  w.Put(updates);
  w.PutBlob(data);
}
Result<SetState> SetState::DecodeBody(ByteReader& r) {
  SetState m;
  if (!r.Get(&m.key_id)) return Truncated("key id");
  TESSERA_RETURN_IF_ERROR(GetSlot(r, &m.slot));
  if (!r.Get(&m.offset)) return Truncated("offset");
  if (!r.Get(&m.updates)) return Truncated("updates");
  std::span<const uint8_t> data;
  if (!r.GetBlob(&data, kMaxStateBytes)) return Truncated("data");
  if (data.empty()) return Status::InvalidArgument("set-state of no bytes");
  m.data.assign(data.begin(), data.end());
  return m;
}

void Release::EncodeBody(MessageWriter& w) const { w.Put(lease_id); }
Result<Release> Release::DecodeBody(ByteReader& r) {
  Release m;
  if (!r.Get(&m.lease_id)) return Truncated("lease_id");
  return m;
}

void SetHyper::EncodeBody(MessageWriter& w) const {
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

}  // namespace tessera::wire
