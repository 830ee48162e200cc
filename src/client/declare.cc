// Declares: through the coordinator (placement into chunks), then a create
// on each shard that holds chunks of them; the result goes into the
// client's tensor table.

#include <future>

#include "ckpt/checkpoint.h"
#include "client/client_impl.h"
#include "core/bytes.h"
#include "core/placement.h"

namespace tessera {

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
  auto placed =
      links_->CallCoordinator<wire::Declare, wire::DeclareReply>(declare, options_.op_timeout);
  if (!placed.ok()) return placed.status();
  if (placed->tensors.size() != specs.size())
    return Status::Internal("declare reply does not match the request");
  // The hyper-parameters in effect win over the declared ones: those the
  // chief set since, or those saved in the checkpoint the cluster restored.
  for (size_t i = 0; i < placed->hyper.size(); ++i) declare.tensors[i].hyper = placed->hyper[i];

  std::vector<client::TensorEntry> entries(specs.size());
  std::vector<wire::Create> creates(links_->size());
  std::vector<std::vector<std::pair<size_t, size_t>>> owners(links_->size());  // (tensor, chunk)
  for (size_t i = 0; i < specs.size(); ++i) {
    client::TensorEntry& e = entries[i];
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
      if (pc.shard >= links_->size())
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
  for (size_t s = 0; s < links_->size(); ++s) {
    if (creates[s].entries.empty()) continue;
    auto reply = links_->Call<wire::Create, wire::CreateReply>(static_cast<int>(s), creates[s],
                                                               options_.op_timeout);
    if (!reply.ok()) return reply.status();
    std::vector<client::Chunk*> chunks;
    for (auto [ti, ci] : owners[s]) chunks.push_back(&entries[ti].chunks[ci]);
    // On the loop thread, where the endpoint lives.
    std::promise<Status> taken;
    ctx_->Post([&] {
      taken.set_value(
          (*links_)[static_cast<int>(s)].TakeCreated(*reply, chunks, options_.cuda_device));
    });
    TESSERA_RETURN_IF_ERROR(taken.get_future().get());
  }

  return tensors_.Add(std::move(entries), placed->restored_step);
}

}  // namespace tessera
