#include "client/tensor_table.h"

#include "core/dtype.h"

namespace tessera::client {

Status TensorTable::ForeignHandle(Tensor t) const {
  const std::string handle = "tensor handle " + std::to_string(t.index);
  if (t.client == 0) {
    return Status::InvalidArgument(handle +
                                   " was not declared by any client (a Tensor{} "
                                   "never set by Declare or Find)");
  }
  if (t.client != client_id_) {
    return Status::InvalidArgument(
        handle +
        " belongs to another client, not to this one: a Tensor is valid only on the client "
        "that declared or found it (a closed client's handles are valid nowhere), so declare "
        "or Find it again on this one");
  }
  return Status::InvalidArgument(handle + " was not declared by this client");
}

Result<const TensorEntry*> TensorTable::Lookup(Tensor t, size_t bytes, std::optional<DType> dtype,
                                               bool check_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return LookupLocked(t, bytes, dtype, check_bytes);
}

Result<const TensorEntry*> TensorTable::LookupLocked(Tensor t, size_t bytes,
                                                     std::optional<DType> dtype,
                                                     bool check_bytes) const {
  if (t.client != client_id_ || t.index >= entries_.size()) return ForeignHandle(t);
  const TensorEntry* e = &entries_[t.index];
  if (dtype && *dtype != e->decl.dtype) {
    return Status::InvalidArgument("tensor '" + e->decl.name + "' is " +
                                   DescribeTensor(e->decl.dtype, e->decl.shape) + ", not " +
                                   DTypeName(*dtype));
  }
  if (check_bytes && bytes != e->bytes) {
    return Status::InvalidArgument(
        "tensor '" + e->decl.name + "' is " + DescribeTensor(e->decl.dtype, e->decl.shape) + " = " +
        std::to_string(e->bytes) + " bytes, but the buffer has " + std::to_string(bytes));
  }
  return e;
}

Result<TensorInfo> TensorTable::Info(Tensor t) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (t.client != client_id_ || t.index >= entries_.size()) return ForeignHandle(t);
  const auto& e = entries_[t.index];
  TensorInfo info{e.decl.name, e.decl.dtype, e.decl.shape, e.decl.rule, e.bytes,
                  {},          {},           e.decl.mode,  e.decl.hyper};
  for (const auto& c : e.chunks) {
    info.shards.push_back(c.shard);
    info.chunks.push_back({c.elem_offset, c.elem_count});
  }
  return info;
}

Result<Tensor> TensorTable::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return Status::NotFound("tensor '" + name + "' was not declared by this client");
  }
  return Tensor{it->second, client_id_};
}

std::vector<Tensor> TensorTable::Add(std::vector<TensorEntry> entries, uint64_t restored_step) {
  std::vector<Tensor> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : entries) {
    if (e.restored) restored_step_ = restored_step;
  }
  for (auto& e : entries) {
    auto it = by_name_.find(e.decl.name);
    if (it != by_name_.end()) {
      out.push_back({it->second, client_id_});
      continue;
    }
    const auto index = static_cast<uint32_t>(entries_.size());
    by_name_[e.decl.name] = index;
    const TensorEntry& added = entries_.emplace_back(std::move(e));
    hot_.push_back({&added, added.chunks.data(), added.bytes,
                    static_cast<uint32_t>(added.chunks.size()), added.decl.dtype,
                    added.decl.mode.kind});
    out.push_back({index, client_id_});
  }
  return out;
}

void TensorTable::Initialized(uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : entries_) e.initialized = true;
  start_step_ = step;
}

void TensorTable::SetStartStep(uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  start_step_ = step;
}

std::optional<uint64_t> TensorTable::restored_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restored_step_;
}

std::optional<uint64_t> TensorTable::start_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return start_step_;
}

}  // namespace tessera::client
