// The one fan-out of Push, Pull and PushPull: a call's items split into each
// shard's chunks, then one part per shard issued on the loop thread.

#include "client/client_impl.h"

namespace tessera {

template <typename Item>
Result<Client::Impl::ByShard> Client::Impl::SplitByShard(
    const std::vector<Item>& items, const char* what,
    const std::function<Status(const TensorEntry&)>& check) {
  ByShard by_shard(shards_.size());
  std::lock_guard<std::mutex> lock(tensors_mu_);
  for (const auto& item : items) {
    const ItemView v = ViewOf(item);
    auto on_gpu = OnGpu(v.data, v.memory);
    if (!on_gpu.ok()) return on_gpu.status().WithContext(what);
    Result<bool> out_on_gpu = false;
    if (v.out != nullptr) out_on_gpu = OnGpu(v.out, v.memory);
    if (!out_on_gpu.ok()) return out_on_gpu.status().WithContext(what);
    auto e = LookupLocked(v.tensor, v.bytes, v.dtype);
    if (!e.ok()) {
      return e.status().WithContext(std::string(what) + (*on_gpu ? " with GPU memory" : ""));
    }
    TESSERA_RETURN_IF_ERROR(check(**e));
    TESSERA_RETURN_IF_ERROR(CheckPart(v.chunks, **e));
    auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(v.data));
    auto* out = static_cast<uint8_t*>(v.out);
    for (size_t i = v.chunks.part; i < (*e)->chunks.size(); i += v.chunks.parts) {
      const Chunk& c = (*e)->chunks[i];
      auto& list = by_shard[c.shard];
      if (list.empty()) list.reserve(items.size());
      list.push_back({&c, data + c.byte_offset, v.min_version, v.min_step, *e, *on_gpu,
                      out == nullptr ? nullptr : out + c.byte_offset, *out_on_gpu});
    }
  }
  return by_shard;
}

template Result<Client::Impl::ByShard> Client::Impl::SplitByShard(
    const std::vector<PushItem>&, const char*, const std::function<Status(const TensorEntry&)>&);
template Result<Client::Impl::ByShard> Client::Impl::SplitByShard(
    const std::vector<PullItem>&, const char*, const std::function<Status(const TensorEntry&)>&);
template Result<Client::Impl::ByShard> Client::Impl::SplitByShard(
    const std::vector<PushPullItem>&, const char*,
    const std::function<Status(const TensorEntry&)>&);

Future Client::Impl::FanOut(ByShard by_shard, IssueFn issue) {
  auto op = NewOp();
  op->Add(1);  // held until every part is issued
  ctx_->Post([op, by_shard = std::move(by_shard), issue = std::move(issue)]() mutable {
    for (size_t s = 0; s < by_shard.size(); ++s) {
      if (by_shard[s].empty()) continue;
      op->Add(1);
      issue(static_cast<int>(s), std::move(by_shard[s]), op,
            [op](const Status& st) { op->Finish(st); });
    }
    op->Finish(Status::Ok());
  });
  return Future(op);
}

}  // namespace tessera
