// The one fan-out of Push, Pull and PushPull: a call's items split into each
// shard's chunks (here), then one part per shard issued on the loop thread
// (FanOut, in client_impl.h).

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

}  // namespace tessera
