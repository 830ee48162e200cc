#include "client/row_calls.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "core/dtype.h"

namespace tessera::client {
namespace {

// Ids per message for rows of `row_bytes`: within both of a message's bounds.
size_t IdsPerMessage(size_t row_bytes) {
  return std::min<size_t>(wire::kMaxIdsPerMessage, wire::kMaxRowBytesPerMessage / row_bytes);
}

// A call's ids made distinct: each distinct id's first position, and for
// every position the first position of its id.
struct Distinct {
  std::vector<uint32_t> first;  // positions of the distinct ids, in order
  std::vector<uint32_t> from;   // per position: the first position of its id
  explicit Distinct(std::span<const int64_t> ids) : from(ids.size()) {
    std::unordered_map<int64_t, uint32_t> seen;
    seen.reserve(ids.size());
    for (uint32_t i = 0; i < ids.size(); ++i) {
      auto [it, fresh] = seen.emplace(ids[i], i);
      from[i] = it->second;
      if (fresh) first.push_back(i);
    }
  }
  bool repeats() const { return first.size() != from.size(); }
};

// f32 element `j` of a row of `dtype`.
float Element(DType dtype, const uint8_t* row, uint32_t j) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * j, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, row + 2 * j, 2);
  return dtype == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
}

// Positions split by the ps task holding their ids, in messages of at most
// `per_message` ids.
std::vector<std::pair<int, std::vector<uint32_t>>> SplitByTask(
    std::span<const int64_t> ids, const std::vector<uint32_t>& positions,
    const RowPlacement& placement, size_t per_message) {
  std::vector<std::vector<uint32_t>> by_task(placement.num_shards());
  for (uint32_t p : positions) by_task[placement.ShardOf(ids[p])].push_back(p);
  std::vector<std::pair<int, std::vector<uint32_t>>> parts;
  for (int task = 0; task < placement.num_shards(); ++task) {
    const auto& all = by_task[task];
    for (size_t at = 0; at < all.size(); at += per_message) {
      const size_t n = std::min(per_message, all.size() - at);
      parts.emplace_back(task, std::vector<uint32_t>(all.begin() + at, all.begin() + at + n));
    }
  }
  return parts;
}

}  // namespace

RowCalls::RowCalls(uint32_t client_id, const ClientOptions& options, transport::Context& ctx,
                   ShardLinks& links, FanOut& fan_out)
    : client_id_(client_id),
      options_(options),
      ctx_(ctx),
      links_(links),
      fan_out_(fan_out),
      placement_(options.cluster.num_tasks("ps")) {}

Result<wire::EmbeddingDecl> RowCalls::ToDecl(const EmbeddingSpec& spec) const {
  wire::EmbeddingDecl d{spec.name,        spec.dim,   spec.dtype,
                        spec.rule,        spec.hyper, spec.ftrl,
                        spec.initializer, spec.mode,  spec.max_rows_per_shard};
  // As a dense tensor's: zeros mean every worker of the cluster.
  if (d.mode.kind != Consistency::kAsync) {
    if (d.mode.total_num_replicas == 0) {
      d.mode.total_num_replicas = static_cast<uint32_t>(options_.cluster.num_workers());
    }
    if (d.mode.kind == Consistency::kSync && d.mode.replicas_to_aggregate == 0) {
      d.mode.replicas_to_aggregate = d.mode.total_num_replicas;
    }
  }
  TESSERA_RETURN_IF_ERROR(wire::ValidateEmbeddingDecl(d));
  return d;
}

Result<Embedding> RowCalls::Declare(const EmbeddingSpec& spec) {
  if (options_.read_only) {
    return Status::FailedPrecondition(options_.task.ToString() +
                                      " is a read-only client: it cannot declare embedding "
                                      "tables (ClientOptions::read_only)");
  }
  auto decl = ToDecl(spec);
  if (!decl.ok()) return decl.status();
  const std::string who = "embedding table '" + spec.name + "'";
  auto reply = links_.CallCoordinator<wire::DeclareTable, wire::DeclareTableReply>(
      {*decl}, options_.op_timeout);
  if (!reply.ok()) return reply.status().WithContext(who);
  if (reply->table.name != spec.name) {
    return Status::Internal(who + ": the coordinator answered for '" + reply->table.name + "'");
  }
  for (int task = 0; task < placement_.num_shards(); ++task) {
    auto made = links_.Call<wire::CreateTable, wire::Ack>(
        task, wire::CreateTable{reply->table_id, reply->table}, options_.op_timeout);
    if (!made.ok()) return made.status().WithContext(who);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const auto index = static_cast<uint32_t>(tables_.size());
  tables_.push_back({reply->table, reply->table_id});
  return Embedding{index, client_id_, reply->table.dim, reply->table.dtype};
}

Result<RowCalls::Declared> RowCalls::Lookup(Embedding table) const {
  if (table.client != client_id_) {
    return Status::InvalidArgument("an Embedding of client " + std::to_string(table.client) +
                                   " used on client " + std::to_string(client_id_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (table.index >= tables_.size()) {
    return Status::InvalidArgument("no embedding table has index " + std::to_string(table.index) +
                                   " on this client");
  }
  const Declared& d = tables_[table.index];
  if (table.dim != d.decl.dim || table.dtype != d.decl.dtype) {
    return Status::InvalidArgument("an Embedding that says dim " + std::to_string(table.dim) + " " +
                                   DTypeName(table.dtype) + " for embedding table '" + d.decl.name +
                                   "', which is dim " + std::to_string(d.decl.dim) + " " +
                                   DTypeName(d.decl.dtype));
  }
  return d;
}

template <typename Msg, typename OnReply>
void RowCalls::Send(std::vector<std::pair<int, Msg>> messages,
                    const std::shared_ptr<Future::State>& op, OnReply on_reply) {
  op->Add(static_cast<int>(messages.size()));
  ctx_.Post([this, op, messages = std::move(messages), on_reply]() mutable {
    for (size_t k = 0; k < messages.size(); ++k) {
      links_.Request(messages[k].first, messages[k].second, 0,
                     [op, k, on_reply](const Status& st, const wire::Header& h,
                                       std::span<const uint8_t> frame) {
                       op->Finish(st.ok() ? on_reply(k, h, frame) : st);
                     });
    }
  });
}

Future RowCalls::Pull(Embedding table, std::span<const int64_t> ids, void* rows,
                      uint64_t min_step) {
  auto declared = Lookup(table);
  if (!declared.ok()) return FailedFuture(declared.status().WithContext("pull of rows"));
  if (rows == nullptr && !ids.empty()) {
    return FailedFuture(Status::InvalidArgument("pull of rows into null"));
  }
  auto op = fan_out_.NewOp();
  op->Add(1);  // held until the parts are handed over
  if (ids.empty()) {
    op->Finish(Status::Ok());
    return Future(op);
  }
  const size_t row_bytes = table.row_bytes();
  auto distinct = std::make_shared<Distinct>(ids);
  auto* out = static_cast<uint8_t*>(rows);
  auto parts = SplitByTask(ids, distinct->first, placement_, IdsPerMessage(row_bytes));
  std::vector<std::pair<int, wire::RowsPull>> messages;
  auto positions = std::make_shared<std::vector<std::vector<uint32_t>>>();
  // As a dense pull's: the shard says what it waits for before the worker's
  // own timeout would end the call without a reason.
  const auto wait_ms =
      static_cast<uint32_t>(options_.op_timeout.count() - options_.op_timeout.count() / 5);
  for (auto& [task, part] : parts) {
    wire::RowsPull m{declared->table_id, min_step, wait_ms, {}};
    for (uint32_t p : part) m.ids.push_back(ids[p]);
    messages.emplace_back(task, std::move(m));
    positions->push_back(std::move(part));
  }
  if (distinct->repeats()) {
    std::lock_guard<std::mutex> lock(op->mu);
    op->then.push_back([distinct, out, row_bytes](const Status& st) {
      if (!st.ok()) return;
      for (size_t i = 0; i < distinct->from.size(); ++i) {
        if (distinct->from[i] != i) {
          std::memcpy(out + i * row_bytes, out + distinct->from[i] * row_bytes, row_bytes);
        }
      }
    });
  }
  Send(std::move(messages), op,
       [positions, out, row_bytes](size_t k, const wire::Header& h,
                                   std::span<const uint8_t> frame) -> Status {
         auto reply = wire::DecodeBody<wire::RowsPullReply>(h, frame);
         if (!reply.ok()) return reply.status();
         const auto& at = (*positions)[k];
         if (reply->rows.size() != at.size() * row_bytes) {
           return Status::Internal("a rows-pull reply of " + std::to_string(reply->rows.size()) +
                                   " bytes for " + std::to_string(at.size()) + " rows");
         }
         for (size_t r = 0; r < at.size(); ++r) {
           std::memcpy(out + at[r] * row_bytes, reply->rows.data() + r * row_bytes, row_bytes);
         }
         return Status::Ok();
       });
  op->Finish(Status::Ok());
  return Future(op);
}

std::vector<std::pair<int, wire::RowsPush>> RowCalls::PushMessages(const Declared& table,
                                                                   std::span<const int64_t> ids,
                                                                   const uint8_t* grads,
                                                                   uint64_t step) {
  const uint32_t dim = table.decl.dim;
  const DType dtype = table.decl.dtype;
  const size_t row_bytes = size_t{dim} * DTypeSize(dtype);
  const Distinct distinct(ids);
  // An id that repeats: its rows summed in f32 in the order given, then
  // rounded once to the table's dtype.
  std::unordered_map<uint32_t, std::vector<float>> sums;
  for (uint32_t i = 0; distinct.repeats() && i < ids.size(); ++i) {
    if (distinct.from[i] == i) continue;
    auto& sum = sums[distinct.from[i]];
    if (sum.empty()) {
      sum.resize(dim);
      const uint8_t* first = grads + size_t{distinct.from[i]} * row_bytes;
      for (uint32_t j = 0; j < dim; ++j) sum[j] = Element(dtype, first, j);
    }
    for (uint32_t j = 0; j < dim; ++j) sum[j] += Element(dtype, grads + i * row_bytes, j);
  }
  std::vector<std::pair<int, wire::RowsPush>> messages;
  for (auto& [task, part] :
       SplitByTask(ids, distinct.first, placement_, IdsPerMessage(row_bytes))) {
    wire::RowsPush m{table.table_id, step, false, {}, {}};
    m.grads.resize(part.size() * row_bytes);
    for (size_t r = 0; r < part.size(); ++r) {
      m.ids.push_back(ids[part[r]]);
      uint8_t* to = m.grads.data() + r * row_bytes;
      auto sum = sums.find(part[r]);
      if (sum == sums.end()) {
        std::memcpy(to, grads + size_t{part[r]} * row_bytes, row_bytes);
        continue;
      }
      const size_t esize = DTypeSize(dtype);
      for (uint32_t j = 0; j < dim; ++j) StoreAs(dtype, sum->second[j], to + j * esize);
    }
    messages.emplace_back(task, std::move(m));
  }
  if (table.decl.mode.kind != Consistency::kSync) return messages;
  // Each task's last message ends the step there; a task without rows gets
  // a message that only ends it.
  std::vector<int> last(placement_.num_shards(), -1);
  for (size_t k = 0; k < messages.size(); ++k) last[messages[k].first] = static_cast<int>(k);
  for (int task = 0; task < placement_.num_shards(); ++task) {
    if (last[task] >= 0) {
      messages[last[task]].second.end_of_step = true;
    } else {
      messages.emplace_back(task, wire::RowsPush{table.table_id, step, true, {}, {}});
    }
  }
  return messages;
}

Future RowCalls::Push(Embedding table, std::span<const int64_t> ids, const void* grads,
                      std::optional<uint64_t> step) {
  auto declared = Lookup(table);
  if (!declared.ok()) return FailedFuture(declared.status().WithContext("push of rows"));
  const bool sync = declared->decl.mode.kind == Consistency::kSync;
  if (sync && !step) {
    return FailedFuture(Status::InvalidArgument("a push of rows of sync embedding table '" +
                                                declared->decl.name +
                                                "' needs its step (PushOptions::step)"));
  }
  if (grads == nullptr && !ids.empty()) {
    return FailedFuture(Status::InvalidArgument("push of rows from null"));
  }
  auto op = fan_out_.NewOp();
  op->Add(1);  // held until the parts are handed over
  if (ids.empty() && !sync) {
    op->Finish(Status::Ok());
    return Future(op);
  }
  auto messages =
      PushMessages(*declared, ids, static_cast<const uint8_t*>(grads), step.value_or(0));
  const std::string name = declared->decl.name;
  Send(std::move(messages), op,
       [name](size_t, const wire::Header& h, std::span<const uint8_t> frame) -> Status {
         auto reply = wire::DecodeBody<wire::RowsPushReply>(h, frame);
         if (!reply.ok()) return reply.status();
         if (reply->nonfinite == 0) return Status::Ok();
         return Status::InvalidArgument(std::to_string(reply->nonfinite) +
                                        " gradient rows of embedding table '" + name +
                                        "' held a NaN or an Inf and were not applied (the " +
                                        std::to_string(reply->applied) + " others were)");
       });
  op->Finish(Status::Ok());
  return Future(op);
}

}  // namespace tessera::client
