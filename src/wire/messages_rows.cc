// Embedding tables' messages: encoders, and decoders that check every field
// they can (row_messages.h).
#include "wire/field_codec.h"
#include "wire/row_messages.h"

namespace tessera::wire {

using field::GetCount;
using field::Truncated;

Status ValidateEmbeddingDecl(const EmbeddingDecl& t) {
  if (t.name.empty() || t.name.size() > kMaxNameLength) {
    return Status::InvalidArgument("table name must have 1 to " + std::to_string(kMaxNameLength) +
                                   " bytes");
  }
  if (HasControlCharacter(t.name)) {
    return Status::InvalidArgument(
        "a table name holds a control character (a newline, an escape...): refused");
  }
  const std::string who = "embedding table '" + t.name + "'";
  if (t.dim == 0 || t.dim > kMaxEmbeddingDim) {
    return Status::InvalidArgument(who + ": dim " + std::to_string(t.dim) + " (1 to " +
                                   std::to_string(kMaxEmbeddingDim) + ")");
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
    return Status::InvalidArgument(who + ": rows are f32, f16 or bf16, not " + DTypeName(t.dtype));
  }
  if (!IsValidUpdateRule(static_cast<uint8_t>(t.rule))) {
    return Status::InvalidArgument(who + ": invalid update rule " +
                                   std::to_string(static_cast<int>(t.rule)));
  }
  TESSERA_RETURN_IF_ERROR(ValidateRuleHyperparams(t.rule, t.hyper, t.ftrl).WithContext(who));
  if (t.initializer.needs_shape()) {
    return Status::InvalidArgument(who +
                                   ": Glorot initializers need a fixed shape, and a table's "
                                   "rows are unbounded: use uniform or normal");
  }
  TESSERA_RETURN_IF_ERROR(t.initializer.Validate().WithContext(who));
  TESSERA_RETURN_IF_ERROR(t.mode.Validate().WithContext(who));
  if (t.max_rows_per_shard == 0) {
    return Status::InvalidArgument(who + ": max_rows_per_shard must be >= 1");
  }
  return Status::Ok();
}

namespace {

void PutFtrl(MessageWriter& w, const FtrlHyperparams& f) {
  for (float v : {f.l1, f.l2, f.beta, f.initial_accumulator}) field::PutFloat(w, v);
}

bool GetFtrl(ByteReader& r, FtrlHyperparams* f) {
  for (float* v : {&f->l1, &f->l2, &f->beta, &f->initial_accumulator}) {
    if (!field::GetFloat(r, v)) return false;
  }
  return true;
}

void PutInitializer(MessageWriter& w, const Initializer& init) {
  w.Put(static_cast<uint8_t>(init.kind));
  for (double v : {init.value, init.low, init.high, init.mean, init.stddev}) {
    field::PutDouble(w, v);
  }
  w.Put(init.seed);
}

bool GetInitializer(ByteReader& r, Initializer* init) {
  uint8_t kind = 0;
  if (!r.Get(&kind)) return false;
  init->kind = static_cast<Initializer::Kind>(kind);
  for (double* v : {&init->value, &init->low, &init->high, &init->mean, &init->stddev}) {
    if (!field::GetDouble(r, v)) return false;
  }
  return r.Get(&init->seed);
}

void PutEmbeddingDecl(MessageWriter& w, const EmbeddingDecl& t) {
  w.PutString(t.name);
  w.Put(t.dim);
  w.Put(static_cast<uint8_t>(t.dtype));
  w.Put(static_cast<uint8_t>(t.rule));
  field::PutHyper(w, t.hyper);
  PutFtrl(w, t.ftrl);
  PutInitializer(w, t.initializer);
  field::PutMode(w, t.mode);
  w.Put(t.max_rows_per_shard);
}

Result<EmbeddingDecl> GetEmbeddingDecl(ByteReader& r) {
  EmbeddingDecl t;
  uint8_t dtype = 0, rule = 0;
  if (!r.GetString(&t.name, kMaxNameLength)) return Truncated("name");
  if (!r.Get(&t.dim) || !r.Get(&dtype) || !r.Get(&rule)) return Truncated("row");
  t.dtype = static_cast<DType>(dtype);
  t.rule = static_cast<UpdateRule>(rule);
  auto hyper = field::GetHyper(r);
  if (!hyper.ok()) return hyper.status().WithContext("embedding table '" + t.name + "'");
  t.hyper = *hyper;
  if (!GetFtrl(r, &t.ftrl)) return Truncated("ftrl hyper-parameters");
  if (!GetInitializer(r, &t.initializer)) return Truncated("initializer");
  auto mode = field::GetMode(r);
  if (!mode.ok()) return mode.status().WithContext("embedding table '" + t.name + "'");
  t.mode = *mode;
  if (!r.Get(&t.max_rows_per_shard)) return Truncated("max_rows_per_shard");
  TESSERA_RETURN_IF_ERROR(ValidateEmbeddingDecl(t));
  return t;
}

void PutIds(MessageWriter& w, const RowIds& ids) {
  w.Put(static_cast<uint32_t>(ids.size()));
  FieldCursor out = w.Extend(ids.size() * 8);
  for (int64_t id : ids) out.Put(id);
}

Status GetIds(ByteReader& r, bool may_be_empty, RowIds* ids) {
  uint32_t count = 0;
  if (!GetCount(r, 8, &count)) return Truncated("id count");
  if (count == 0 && !may_be_empty) return Status::InvalidArgument("no ids");
  if (count > kMaxIdsPerMessage) {
    return Status::InvalidArgument(std::to_string(count) + " ids in one message (at most " +
                                   std::to_string(kMaxIdsPerMessage) + ")");
  }
  FieldReader in;
  if (!r.GetFields(size_t{count} * 8, &in)) return Truncated("ids");
  ids->resize(count);
  for (auto& id : *ids) id = in.Get<int64_t>();
  return Status::Ok();
}

Status GetRowBytes(ByteReader& r, const char* what, std::vector<uint8_t>* out) {
  std::span<const uint8_t> bytes;
  if (!r.GetBlob(&bytes, kMaxRowBytesPerMessage)) return Truncated(what);
  out->assign(bytes.begin(), bytes.end());
  return Status::Ok();
}

}  // namespace

void DeclareTable::EncodeBody(MessageWriter& w) const { PutEmbeddingDecl(w, table); }
Result<DeclareTable> DeclareTable::DecodeBody(ByteReader& r) {
  auto t = GetEmbeddingDecl(r);
  if (!t.ok()) return t.status();
  return DeclareTable{std::move(*t)};
}

void DeclareTableReply::EncodeBody(MessageWriter& w) const {
  w.Put(table_id);
  PutEmbeddingDecl(w, table);
}
Result<DeclareTableReply> DeclareTableReply::DecodeBody(ByteReader& r) {
  DeclareTableReply m;
  if (!r.Get(&m.table_id)) return Truncated("table_id");
  auto t = GetEmbeddingDecl(r);
  if (!t.ok()) return t.status();
  m.table = std::move(*t);
  return m;
}

void CreateTable::EncodeBody(MessageWriter& w) const {
  w.Put(table_id);
  PutEmbeddingDecl(w, table);
}
Result<CreateTable> CreateTable::DecodeBody(ByteReader& r) {
  CreateTable m;
  if (!r.Get(&m.table_id)) return Truncated("table_id");
  if (m.table_id == 0 || m.table_id > kMaxEmbeddingTables) {
    return Status::InvalidArgument("table id " + std::to_string(m.table_id) + " (1 to " +
                                   std::to_string(kMaxEmbeddingTables) + ")");
  }
  auto t = GetEmbeddingDecl(r);
  if (!t.ok()) return t.status();
  m.table = std::move(*t);
  return m;
}

void RowsPull::EncodeBody(MessageWriter& w) const {
  w.Put(table_id);
  w.Put(min_step);
  w.Put(wait_ms);
  PutIds(w, ids);
}
Result<RowsPull> RowsPull::DecodeBody(ByteReader& r) {
  RowsPull m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status RowsPull::DecodeBodyInto(ByteReader& r, RowsPull* m) {
  if (!r.Get(&m->table_id) || !r.Get(&m->min_step) || !r.Get(&m->wait_ms)) {
    return Truncated("table, step or wait");
  }
  return GetIds(r, false, &m->ids);
}

void RowsPullReply::EncodeBody(MessageWriter& w) const { w.PutBlob(rows); }
Result<RowsPullReply> RowsPullReply::DecodeBody(ByteReader& r) {
  RowsPullReply m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status RowsPullReply::DecodeBodyInto(ByteReader& r, RowsPullReply* m) {
  return GetRowBytes(r, "rows", &m->rows);
}

void RowsPush::EncodeBody(MessageWriter& w) const {
  w.Put(table_id);
  w.Put(step);
  w.Put(static_cast<uint8_t>(end_of_step ? 1 : 0));
  PutIds(w, ids);
  w.PutBlob(grads);
}
Result<RowsPush> RowsPush::DecodeBody(ByteReader& r) {
  RowsPush m;
  TESSERA_RETURN_IF_ERROR(DecodeBodyInto(r, &m));
  return m;
}
Status RowsPush::DecodeBodyInto(ByteReader& r, RowsPush* m) {
  uint8_t end = 0;
  if (!r.Get(&m->table_id) || !r.Get(&m->step) || !r.Get(&end)) {
    return Truncated("table, step or end of step");
  }
  if (end > 1) return Status::InvalidArgument("bad end-of-step flag");
  m->end_of_step = end == 1;
  // Only an end-of-step marker may carry no rows.
  TESSERA_RETURN_IF_ERROR(GetIds(r, m->end_of_step, &m->ids));
  TESSERA_RETURN_IF_ERROR(GetRowBytes(r, "gradients", &m->grads));
  if (m->ids.empty() != m->grads.empty()) {
    return Status::InvalidArgument(std::to_string(m->ids.size()) + " ids with " +
                                   std::to_string(m->grads.size()) + " bytes of gradients");
  }
  if (!m->ids.empty() && m->grads.size() % m->ids.size() != 0) {
    return Status::InvalidArgument(std::to_string(m->grads.size()) +
                                   " bytes of gradients are not a whole number of rows for " +
                                   std::to_string(m->ids.size()) + " ids");
  }
  return Status::Ok();
}

void RowsPushReply::EncodeBody(MessageWriter& w) const {
  w.Put(applied);
  w.Put(created);
  w.Put(dropped);
  w.Put(nonfinite);
}
Result<RowsPushReply> RowsPushReply::DecodeBody(ByteReader& r) {
  RowsPushReply m;
  if (!r.Get(&m.applied) || !r.Get(&m.created) || !r.Get(&m.dropped) || !r.Get(&m.nonfinite)) {
    return Truncated("counts");
  }
  return m;
}

}  // namespace tessera::wire
