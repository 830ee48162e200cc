#include <algorithm>
#include <bit>
#include <cstring>

#include "wire/field_codec.h"

namespace tessera::wire::field {

Status Truncated(const char* what) {
  return Status::InvalidArgument(std::string("truncated or oversized field '") + what + "'");
}

bool GetCount(ByteReader& r, size_t min_item_bytes, uint32_t* count) {
  if (!r.Get(count)) return false;
  return static_cast<uint64_t>(*count) * min_item_bytes <= r.remaining();
}

void PutFloat(MessageWriter& w, float f) {
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

void PutHyper(MessageWriter& w, const Hyperparams& h) {
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

void PutDouble(MessageWriter& w, double d) { w.Put(std::bit_cast<uint64_t>(d)); }

bool GetDouble(ByteReader& r, double* d) {
  uint64_t bits = 0;
  if (!r.Get(&bits)) return false;
  *d = std::bit_cast<double>(bits);
  return true;
}

void PutMode(MessageWriter& w, const ConsistencyMode& mode) {
  w.Put(static_cast<uint8_t>(mode.kind));
  w.Put(mode.replicas_to_aggregate);
  w.Put(mode.total_num_replicas);
  w.Put(static_cast<uint8_t>(mode.average ? 1 : 0));
  w.Put(mode.staleness);
}

// Its kind is checked by the declaration's validation (ConsistencyMode::Validate).
Result<ConsistencyMode> GetMode(ByteReader& r) {
  ConsistencyMode mode;
  uint8_t kind = 0, average = 0;
  if (!r.Get(&kind) || !r.Get(&mode.replicas_to_aggregate) || !r.Get(&mode.total_num_replicas) ||
      !r.Get(&average) || !r.Get(&mode.staleness)) {
    return Truncated("consistency mode");
  }
  if (average > 1) return Status::InvalidArgument("bad average flag");
  mode.kind = static_cast<Consistency>(kind);
  mode.average = average == 1;
  return mode;
}

void PutTensorDecl(MessageWriter& w, const TensorDecl& t) {
  w.PutString(t.name);
  w.Put(static_cast<uint8_t>(t.dtype));
  w.Put(static_cast<uint8_t>(t.rule));
  w.Put(static_cast<uint8_t>(t.shape.size()));
  for (int64_t d : t.shape) w.Put(d);
  w.Put(t.pinned_shard);
  PutHyper(w, t.hyper);
  PutMode(w, t.mode);
}

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
  auto mode = GetMode(r);
  if (!mode.ok()) return mode.status().WithContext("tensor '" + t.name + "'");
  t.mode = *mode;
  TESSERA_RETURN_IF_ERROR(ValidateTensorDecl(t));
  return t;
}

void PutCreateEntry(MessageWriter& w, const CreateEntry& e) {
  PutTensorDecl(w, e.tensor);
  w.Put(e.chunk_index);
  w.Put(e.num_chunks);
  w.Put(e.elem_offset);
  w.Put(e.elem_count);
}

Result<CreateEntry> GetCreateEntry(ByteReader& r) {
  CreateEntry e;
  auto t = GetTensorDecl(r);
  if (!t.ok()) return t.status();
  e.tensor = std::move(*t);
  if (!r.Get(&e.chunk_index) || !r.Get(&e.num_chunks) || !r.Get(&e.elem_offset) ||
      !r.Get(&e.elem_count)) {
    return Truncated("chunk");
  }
  const uint64_t total = NumElements(e.tensor.shape).value();
  if (e.num_chunks == 0 || e.chunk_index >= e.num_chunks || e.elem_offset > total ||
      e.elem_count > total - e.elem_offset || (e.elem_count == 0 && total != 0)) {
    return Status::InvalidArgument(
        "tensor '" + e.tensor.name + "': chunk " + std::to_string(e.chunk_index) + "/" +
        std::to_string(e.num_chunks) + " [" + std::to_string(e.elem_offset) + ", +" +
        std::to_string(e.elem_count) + ") does not fit its shape");
  }
  return e;
}

}  // namespace tessera::wire::field
