#include "server/rows_push_applier.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/log.h"

namespace tessera::server {

Status RowsPushApplier::CheckRoom(HeldRows& table, const wire::RowIds& ids) {
  embed::RowStore& rows = *table.rows;
  const uint64_t limit = table.decl.max_rows_per_shard;
  // Only a push that could reach the limit pays for looking every id up twice.
  if (rows.rows() + ids.size() <= limit) return Status::Ok();
  uint64_t made = 0;
  for (int64_t id : ids) made += rows.Find(id) == nullptr ? 1 : 0;
  if (rows.rows() + made <= limit) return Status::Ok();
  return Status::ResourceExhausted(table.Describe() + " holds " + std::to_string(rows.rows()) +
                                   " rows on this ps task and this push would make " +
                                   std::to_string(made) + " more, beyond its limit of " +
                                   std::to_string(limit) + " (max_rows_per_shard)");
}

bool RowsPushApplier::Widen(DType dtype, const uint8_t* row, uint32_t dim) {
  grad_.resize(dim);
  float* g = grad_.data();
  if (dtype == DType::kF32) {
    std::memcpy(g, row, dim * sizeof(float));
  } else {
    for (uint32_t j = 0; j < dim; ++j) {
      uint16_t bits;
      std::memcpy(&bits, row + 2 * j, 2);
      g[j] = dtype == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
    }
  }
  bool finite = true;
  for (uint32_t j = 0; j < dim; ++j) finite &= std::isfinite(g[j]);
  return finite;
}

bool RowsPushApplier::Serve(Peer& peer, uint64_t request_id, HeldRows& table,
                            const wire::RowsPush& msg) {
  const size_t row_bytes = table.rows->value_bytes();
  if (msg.grads.size() != msg.ids.size() * row_bytes) {
    sessions_.SendError(
        peer, request_id,
        Status::InvalidArgument(std::to_string(msg.grads.size()) + " bytes of gradients for " +
                                std::to_string(msg.ids.size()) + " ids of " + table.Describe() +
                                ", whose rows take " + std::to_string(row_bytes) + " bytes"));
    return false;
  }
  if (table.sync) return HoldForStep(peer, request_id, table, msg);
  if (msg.end_of_step) {
    sessions_.SendError(
        peer, request_id,
        Status::InvalidArgument(table.Describe() + " is not a sync table: its pushes end no step"));
    return false;
  }
  ApplyNow(peer, request_id, table, msg);
  return false;
}

void RowsPushApplier::ApplyNow(Peer& peer, uint64_t request_id, HeldRows& table,
                               const wire::RowsPush& msg) {
  if (Status room = CheckRoom(table, msg.ids); !room.ok()) {
    return sessions_.SendError(peer, request_id, room);
  }
  embed::RowStore& rows = *table.rows;
  const size_t row_bytes = rows.value_bytes();
  wire::RowsPushReply reply;
  const auto step = static_cast<uint32_t>(msg.step);
  for (size_t i = 0; i < msg.ids.size(); ++i) {
    if (!Widen(table.decl.dtype, msg.grads.data() + i * row_bytes, table.decl.dim)) {
      ++reply.nonfinite;
      continue;
    }
    embed::RowHeader* row = rows.Find(msg.ids[i]);
    if (row == nullptr) {
      auto made = rows.Create(msg.ids[i]);
      if (!made.ok()) return sessions_.SendError(peer, request_id, made.status());
      row = *made;
      ++reply.created;
    }
    rows.Apply(row, grad_.data(), step);
    ++reply.applied;
  }
  rows_applied_ += reply.applied;
  nonfinite_rows_ += reply.nonfinite;
  sessions_.Reply(peer, request_id, reply);
}

bool RowsPushApplier::HoldForStep(Peer& peer, uint64_t request_id, HeldRows& table,
                                  const wire::RowsPush& msg) {
  const size_t row_bytes = table.rows->value_bytes();
  const uint32_t dim = table.decl.dim;
  wire::RowsPushReply reply;
  held_ids_.clear();
  held_grads_.clear();
  for (size_t i = 0; i < msg.ids.size(); ++i) {
    if (!Widen(table.decl.dtype, msg.grads.data() + i * row_bytes, dim)) {
      ++reply.nonfinite;
      continue;
    }
    held_ids_.push_back(msg.ids[i]);
    held_grads_.insert(held_grads_.end(), grad_.begin(), grad_.end());
  }
  auto held = table.sync->Hold(peer.hello.task_index, msg.step, held_ids_, held_grads_.data(),
                               msg.end_of_step);
  if (!held.ok()) {
    sessions_.SendError(peer, request_id, held.status().WithContext(table.Describe()));
    return false;
  }
  if (*held == SyncRowSteps::Held::kHeld) {
    reply.applied = static_cast<uint32_t>(held_ids_.size());
  } else {
    reply.dropped = static_cast<uint32_t>(held_ids_.size());
  }
  nonfinite_rows_ += reply.nonfinite;
  const bool stepped = ApplyReadySteps(table, &reply);
  sessions_.Reply(peer, request_id, reply);
  return stepped;
}

bool RowsPushApplier::ApplyReadySteps(HeldRows& table, wire::RowsPushReply* reply) {
  bool stepped = false;
  embed::RowStore& rows = *table.rows;
  while (table.sync->Ready()) {
    const auto step = static_cast<uint32_t>(table.sync->applied_steps());
    uint64_t unmade = 0;
    table.sync->ApplyNext([&](int64_t id, const float* grad) {
      embed::RowHeader* row = rows.Find(id);
      if (row == nullptr) {
        auto made = rows.Create(id);
        if (!made.ok()) {
          ++unmade;
          return;
        }
        row = *made;
        ++reply->created;
      }
      rows.Apply(row, grad, step);
      ++rows_applied_;
    });
    if (unmade != 0) {
      TLOG_ERROR("{}: step {} left {} rows unmade: the table holds its limit of {} rows here",
                 table.Describe(), step, unmade, table.decl.max_rows_per_shard);
    }
    stepped = true;
  }
  return stepped;
}

}  // namespace tessera::server
