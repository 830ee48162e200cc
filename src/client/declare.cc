// Declares: through the coordinator (placement into chunks), then a create
// on each shard that holds chunks of them; the result goes into the
// client's tensor table.

#include "ckpt/checkpoint.h"
#include "client/client_impl.h"
#include "core/bytes.h"
#include "core/placement.h"

namespace tessera {

uint32_t Client::Impl::NextId() {
  static std::atomic<uint32_t> last{0};
  uint32_t id = 0;
  while (id == 0) id = last.fetch_add(1, std::memory_order_relaxed) + 1;  // 0 is no client's
  return id;
}

Result<std::vector<Tensor>> Client::Impl::DeclareMany(const std::vector<TensorSpec>& specs) {
  Result<std::vector<Tensor>> out = Status::Internal("the declare did not run");
  // The job runs before its future completes, so `out` and `specs` outlive it.
  Status st = control_
                  .Submit([&] {
                    out = DeclareNow(specs);
                    return out.status();
                  })
                  .Wait();
  if (!st.ok()) return st;
  return out;
}

Future Client::Impl::DeclareManyAsync(std::vector<TensorSpec> specs, std::vector<Tensor>* tensors) {
  return control_.Submit([this, specs = std::move(specs), tensors] {
    auto declared = DeclareNow(specs);
    if (!declared.ok()) return declared.status();
    if (tensors != nullptr) *tensors = std::move(*declared);
    return Status::Ok();
  });
}

Result<std::vector<Tensor>> Client::Impl::DeclareNow(const std::vector<TensorSpec>& specs) {
  wire::Declare declare;
  declare.chunk_bytes = options_.chunk_bytes;
  declare.placement = static_cast<uint8_t>(ParsePlacementPolicy(options_.placement).value());
  for (const auto& spec : specs) {
    if (spec.name.empty() || spec.name.size() > wire::kMaxNameLength) {
      return Status::InvalidArgument("tensor name must have 1 to 1024 bytes");
    }
    if (!IsValidDType(static_cast<uint8_t>(spec.dtype))) {
      return Status::InvalidArgument("tensor '" + spec.name + "': invalid dtype");
    }
    if (spec.shape.size() > wire::kMaxDims) {
      return Status::InvalidArgument("tensor '" + spec.name + "': more than 8 dimensions");
    }
    auto n = NumElements(spec.shape);
    if (!n.ok()) return n.status().WithContext("tensor '" + spec.name + "'");
    uint64_t bytes = *n * DTypeSize(spec.dtype);
    if (!spec.initial.empty() && spec.initial.size() != bytes) {
      return Status::InvalidArgument(
          "tensor '" + spec.name + "': initial value has " + std::to_string(spec.initial.size()) +
          " bytes, " + DescribeTensor(spec.dtype, spec.shape) + " needs " + std::to_string(bytes));
    }
    TESSERA_RETURN_IF_ERROR(spec.hyper.Validate().WithContext("tensor '" + spec.name + "'"));
    if (spec.initial.empty() && spec.initializer.kind != Initializer::Kind::kZeros) {
      // Check the initializer fits now, not when the chief initialises.
      auto probe = InitialValue(spec.initializer, spec.name, spec.dtype, {});
      if (!probe.ok()) return probe.status();
    }
    ConsistencyMode mode = spec.mode;
    // A reader's mode is not its to decide (the declaring workers' is in
    // effect at the shards), nor does its spec need the workers to check it.
    if (mode.kind != Consistency::kAsync && !options_.read_only) {
      if (mode.total_num_replicas == 0) {
        mode.total_num_replicas = static_cast<uint32_t>(options_.cluster.num_workers());
      }
      if (mode.kind == Consistency::kSync && mode.replicas_to_aggregate == 0) {
        mode.replicas_to_aggregate = mode.total_num_replicas;
      }
      if (mode.total_num_replicas > static_cast<uint32_t>(options_.cluster.num_workers())) {
        return Status::InvalidArgument("tensor '" + spec.name + "': total_num_replicas " +
                                       std::to_string(mode.total_num_replicas) +
                                       " exceeds the cluster's " +
                                       std::to_string(options_.cluster.num_workers()) + " workers");
      }
    }
    declare.tensors.push_back(
        {spec.name, spec.dtype, spec.rule, spec.shape, spec.pinned_shard, spec.hyper, mode});
    TESSERA_RETURN_IF_ERROR(wire::ValidateTensorDecl(declare.tensors.back()));
    TESSERA_RETURN_IF_ERROR(ckpt::CheckNotSlotName(spec.name));
  }
  auto placed = CallCoordinator<wire::Declare, wire::DeclareReply>(declare, options_.op_timeout);
  if (!placed.ok()) return placed.status();
  if (placed->tensors.size() != specs.size())
    return Status::Internal("declare reply does not match the request");
  // The hyper-parameters in effect win over the declared ones: those the
  // chief set since, or those saved in the checkpoint the cluster restored.
  for (size_t i = 0; i < placed->hyper.size(); ++i) declare.tensors[i].hyper = placed->hyper[i];

  std::vector<TensorEntry> entries(specs.size());
  std::vector<wire::Create> creates(shards_.size());
  std::vector<std::vector<std::pair<size_t, size_t>>> owners(shards_.size());  // (tensor, chunk)
  for (size_t i = 0; i < specs.size(); ++i) {
    TensorEntry& e = entries[i];
    e.decl = declare.tensors[i];
    e.initial = specs[i].initial;
    e.initializer = specs[i].initializer;
    e.restored = i < placed->restored.size() && placed->restored[i] == 1;
    e.initialized = i < placed->initialized.size() && placed->initialized[i] == 1;
    const size_t esize = DTypeSize(e.decl.dtype);
    e.bytes = NumElements(e.decl.shape).value() * esize;
    const auto& chunks = placed->tensors[i];
    for (size_t c = 0; c < chunks.size(); ++c) {
      const auto& pc = chunks[c];
      if (pc.shard >= shards_.size())
        return Status::Internal("coordinator placed a chunk on an unknown shard");
      e.chunks.push_back({static_cast<int>(pc.shard), pc.elem_offset, pc.elem_count,
                          pc.elem_offset * esize, pc.elem_count * esize});
      wire::CreateEntry ce;
      ce.tensor = declare.tensors[i];
      ce.chunk_index = static_cast<uint32_t>(c);
      ce.num_chunks = static_cast<uint32_t>(chunks.size());
      ce.elem_offset = pc.elem_offset;
      ce.elem_count = pc.elem_count;
      creates[pc.shard].entries.push_back(std::move(ce));
      owners[pc.shard].emplace_back(i, c);
    }
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (creates[s].entries.empty()) continue;
    auto reply =
        Call<wire::Create, wire::CreateReply>(static_cast<int>(s), creates[s], options_.op_timeout);
    if (!reply.ok()) return reply.status();
    if (reply->keys.size() != owners[s].size())
      return Status::Internal("create reply does not match the request");
    // Attach arenas on the loop thread, where the endpoint lives.
    std::promise<Status> attached;
    ctx_->Post([&] {
      for (const auto& a : reply->arenas) {
        auto r = shards_[s].ep ? shards_[s].ep->Attach(a.region)
                               : Result<std::unique_ptr<transport::RemoteRegion>>(shards_[s].dead);
        if (!r.ok()) return attached.set_value(r.status());
        shards_[s].arenas[a.arena_id] = std::move(*r);
        MapArena(shards_[s], a);
      }
      attached.set_value(Status::Ok());
    });
    TESSERA_RETURN_IF_ERROR(attached.get_future().get());
    for (size_t k = 0; k < reply->keys.size(); ++k) {
      auto [ti, ci] = owners[s][k];
      Chunk& chunk = entries[ti].chunks[ci];
      const auto& loc = reply->keys[k];
      if (loc.byte_length != chunk.bytes)
        return Status::Internal("shard holds a chunk of another size");
      chunk.key_id = loc.key_id;
      chunk.arena_id = loc.arena_id;
      chunk.arena_offset = loc.arena_offset;
    }
  }

  return tensors_.Add(std::move(entries), placed->restored_step);
}

}  // namespace tessera
