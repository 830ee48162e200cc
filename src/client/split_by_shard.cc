// Splitting a call's items by shard, and the errors of an item that does not
// fit its tensor.

#include "client/split_by_shard.h"

#include "client/gpu_access.h"

namespace tessera::client {
namespace {

// An item of any call, as the split sees it.
struct ItemView {
  Tensor tensor;
  size_t bytes;
  std::optional<DType> dtype;
  BufferMemory memory;
  ChunkPart chunks;
  const void* data;
  void* out = nullptr;
  uint64_t min_version = 0, min_step = 0;
  bool has_out = false;  // a push_pull's: `out` is where its weights go
};

ItemView ViewOf(const PushItem& i) {
  return {i.tensor, i.bytes, i.dtype, i.memory, i.chunks, i.data};
}
ItemView ViewOf(const PullItem& i) {
  return {i.tensor, i.bytes, i.dtype,       i.memory,  i.chunks,
          i.data,   nullptr, i.min_version, i.min_step};
}
ItemView ViewOf(const PushPullItem& i) {
  return {i.tensor, i.bytes, i.dtype, i.memory, i.chunks, i.gradient, i.weights, 0, 0, true};
}

// The error for an item whose buffer is a null pointer (the table locked).
Status NullBuffer(const TensorTable& tensors, const ItemView& v, const char* what) {
  std::string name = "a tensor";
  if (auto e = tensors.LookupLocked(v.tensor, v.bytes, v.dtype, /*check_bytes=*/false); e.ok()) {
    name = "tensor '" + (*e)->decl.name + "'";
  }
  const char* which = v.data == nullptr ? (v.has_out ? "gradient" : "data") : "weights";
  return Status::InvalidArgument(std::string(what) + ": " + name + " has a null " + which +
                                 " pointer for " + std::to_string(v.bytes) + " bytes");
}

// What a call says of an item whose ChunkPart names no part.
Status PartError(const ChunkPart& p, const TensorEntry& e) {
  return Status::InvalidArgument("tensor '" + e.decl.name + "': chunk part " +
                                 std::to_string(p.part) + " of " + std::to_string(p.parts));
}

// Where the item's buffers are: whether `data` and `out` are GPU memory.
// Called only for an item that may be (the caller's test, inline: a
// Status per item would cost a batch of small tensors its construction).
Status FindMemory(const ItemView& v, bool* on_gpu, bool* out_on_gpu) {
  auto r = GpuAccess::OnGpu(v.data, v.memory);
  if (!r.ok()) return r.status();
  *on_gpu = *r;
  if (v.out == nullptr) return Status::Ok();
  r = GpuAccess::OnGpu(v.out, v.memory);
  if (!r.ok()) return r.status();
  *out_on_gpu = *r;
  return Status::Ok();
}

}  // namespace

template <typename Item>
Result<ByShard> SplitByShard(const TensorTable& tensors, size_t num_shards,
                             const std::vector<Item>& items, const char* what,
                             RefuseSync refuse_sync) {
  ByShard by_shard(num_shards);
  // Asked once a call: without a usable GPU only a buffer said to be GPU
  // memory needs a look (to refuse it), not every item's.
  const bool ask_cuda = gpu::PointersMayBeDevice();
  auto lock = tensors.Lock();
  for (const auto& item : items) {
    const ItemView v = ViewOf(item);
    if (v.bytes > 0 && (v.data == nullptr || (v.has_out && v.out == nullptr))) {
      return NullBuffer(tensors, v, what);
    }
    bool on_gpu = false, out_on_gpu = false;
    if (v.memory == BufferMemory::kCuda || (ask_cuda && v.memory != BufferMemory::kHost)) {
      if (Status st = FindMemory(v, &on_gpu, &out_on_gpu); !st.ok()) return st.WithContext(what);
    }
    // The checks' cheap form first; the errors are built only when one fails.
    const TensorHot* h = tensors.MatchLocked(v.tensor, v.bytes, v.dtype);
    if (h == nullptr) {
      return tensors.LookupLocked(v.tensor, v.bytes, v.dtype)
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

template Result<ByShard> SplitByShard(const TensorTable&, size_t, const std::vector<PushItem>&,
                                      const char*, RefuseSync);
template Result<ByShard> SplitByShard(const TensorTable&, size_t, const std::vector<PullItem>&,
                                      const char*, RefuseSync);
template Result<ByShard> SplitByShard(const TensorTable&, size_t, const std::vector<PushPullItem>&,
                                      const char*, RefuseSync);

}  // namespace tessera::client
