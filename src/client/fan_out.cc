// The one fan-out of Push, Pull and PushPull: a call's items split into each
// shard's chunks (here), then one part per shard issued on the loop thread
// (FanOut, in client_impl.h).

#include "client/client_impl.h"

namespace tessera {

Status Client::Impl::NullBuffer(const ItemView& v, const char* what) const {
  std::string name = "a tensor";
  if (auto e = tensors_.LookupLocked(v.tensor, v.bytes, v.dtype, /*check_bytes=*/false); e.ok()) {
    name = "tensor '" + (*e)->decl.name + "'";
  }
  const char* which = v.data == nullptr ? (v.has_out ? "gradient" : "data") : "weights";
  return Status::InvalidArgument(std::string(what) + ": " + name + " has a null " + which +
                                 " pointer for " + std::to_string(v.bytes) + " bytes");
}

template <typename Item>
Result<Client::Impl::ByShard> Client::Impl::SplitByShard(const std::vector<Item>& items,
                                                         const char* what, RefuseSync refuse_sync) {
  ByShard by_shard(shards_.size());
  // Asked once a call: without a usable GPU only a buffer said to be GPU
  // memory needs a look (to refuse it), not every item's.
  const bool ask_cuda = gpu::PointersMayBeDevice();
  auto lock = tensors_.Lock();
  for (const auto& item : items) {
    const ItemView v = ViewOf(item);
    if (v.bytes > 0 && (v.data == nullptr || (v.has_out && v.out == nullptr))) {
      return NullBuffer(v, what);
    }
    bool on_gpu = false, out_on_gpu = false;
    if (v.memory == BufferMemory::kCuda || (ask_cuda && v.memory != BufferMemory::kHost)) {
      auto r = OnGpu(v.data, v.memory);
      if (!r.ok()) return r.status().WithContext(what);
      on_gpu = *r;
      if (v.out != nullptr) {
        r = OnGpu(v.out, v.memory);
        if (!r.ok()) return r.status().WithContext(what);
        out_on_gpu = *r;
      }
    }
    // The checks' cheap form first; the errors are built only when one fails.
    const TensorHot* h = tensors_.MatchLocked(v.tensor, v.bytes, v.dtype);
    if (h == nullptr) {
      return tensors_.LookupLocked(v.tensor, v.bytes, v.dtype)
          .status()
          .WithContext(std::string(what) + (on_gpu ? " with GPU memory" : ""));
    }
    const TensorEntry* e = h->entry;
    if (refuse_sync != nullptr && h->kind == Consistency::kSync) return refuse_sync(*e);
    if (v.chunks.parts == 0 || v.chunks.part >= v.chunks.parts) return PartError(v.chunks, *e);
    auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(v.data));
    auto* out = static_cast<uint8_t*>(v.out);
    for (size_t i = v.chunks.part; i < h->chunk_count; i += v.chunks.parts) {
      const Chunk& c = h->chunks[i];
      auto& list = by_shard[c.shard];
      if (list.empty()) list.reserve(items.size());
      list.push_back({&c, data + c.byte_offset, v.min_version, v.min_step, e, on_gpu,
                      out == nullptr ? nullptr : out + c.byte_offset, out_on_gpu});
    }
  }
  return by_shard;
}

template Result<Client::Impl::ByShard> Client::Impl::SplitByShard(const std::vector<PushItem>&,
                                                                  const char*, RefuseSync);
template Result<Client::Impl::ByShard> Client::Impl::SplitByShard(const std::vector<PullItem>&,
                                                                  const char*, RefuseSync);
template Result<Client::Impl::ByShard> Client::Impl::SplitByShard(const std::vector<PushPullItem>&,
                                                                  const char*, RefuseSync);

}  // namespace tessera
