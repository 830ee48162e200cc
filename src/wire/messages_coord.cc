// Steps, joins and checkpoint rounds between ps tasks and the coordinator.
#include <cstring>

#include "wire/field_codec.h"
#include "wire/messages.h"

namespace tessera::wire {

using namespace field;  // this layer's own field codecs

void StepsApplied::EncodeBody(MessageWriter& w) const {
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

void StepReply::EncodeBody(MessageWriter& w) const { w.Put(step); }
Result<StepReply> StepReply::DecodeBody(ByteReader& r) {
  StepReply m;
  if (!r.Get(&m.step)) return Truncated("step");
  return m;
}

void InitDone::EncodeBody(MessageWriter& w) const { w.Put(start_step); }
Result<InitDone> InitDone::DecodeBody(ByteReader& r) {
  InitDone m;
  if (!r.Get(&m.start_step)) return Truncated("start_step");
  return m;
}

void Join::EncodeBody(MessageWriter& w) const {
  w.Put(static_cast<uint32_t>(chunks.size()));
  for (size_t i = 0; i < chunks.size(); ++i) {
    PutCreateEntry(w, chunks[i]);
    w.Put(static_cast<uint8_t>(i < initialized.size() && initialized[i] != 0 ? 1 : 0));
  }
  w.Put(sync_step);
  w.Put(static_cast<uint8_t>(more ? 1 : 0));
}
Result<Join> Join::DecodeBody(ByteReader& r) {
  Join m;
  uint32_t count = 0;
  if (!GetCount(r, kMinCreateEntryBytes + 1, &count)) return Truncated("chunk count");
  if (count > kMaxChunks) {
    return Status::InvalidArgument("a join of " + std::to_string(count) + " chunks (at most " +
                                   std::to_string(kMaxChunks) + " a message)");
  }
  m.chunks.reserve(count);
  m.initialized.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto e = GetCreateEntry(r);
    if (!e.ok()) return e.status();
    uint8_t init = 0;
    if (!r.Get(&init) || init > 1) return Status::InvalidArgument("bad initialized flag");
    m.chunks.push_back(std::move(*e));
    m.initialized.push_back(init);
  }
  if (!r.Get(&m.sync_step)) return Truncated("sync_step");
  uint8_t more = 0;
  if (!r.Get(&more) || more > 1) return Status::InvalidArgument("bad more flag");
  m.more = more == 1;
  return m;
}

void JoinReply::EncodeBody(MessageWriter& w) const {
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

void CkptPrepared::EncodeBody(MessageWriter& w) const {
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

void CkptWrite::EncodeBody(MessageWriter& w) const {
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

void CkptWritten::EncodeBody(MessageWriter& w) const {
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
  if (code > static_cast<uint8_t>(StatusCode::kCancelled))
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

void CheckpointSaved::EncodeBody(MessageWriter& w) const {
  w.Put(global_step);
  w.PutString(path);
}
Result<CheckpointSaved> CheckpointSaved::DecodeBody(ByteReader& r) {
  CheckpointSaved m;
  if (!r.Get(&m.global_step)) return Truncated("global_step");
  if (!r.GetString(&m.path, kMaxPathLength)) return Truncated("path");
  return m;
}

}  // namespace tessera::wire
