#include "server/row_tables.h"

#include <algorithm>

#include "core/host_memory.h"
#include "core/log.h"

namespace tessera::server {

RowTables::RowTables(Lent lent)
    : lent_(lent),
      placement_(lent.options->cluster.num_tasks("ps")),
      pulls_(*lent.sessions),
      waits_({lent.ctx, lent.sessions,
              [this](uint32_t table_id, uint64_t step) {
                auto it = tables_.find(table_id);
                if (it == tables_.end() || !it->second.sync) return std::string("a table gone");
                return it->second.Describe() + ": " + it->second.sync->Missing(step);
              }}),
      pushes_(*lent.sessions) {}

uint64_t RowTables::SyncStepReached() const {
  uint64_t furthest = 0;
  for (const auto& [id, t] : tables_) {
    if (t.sync) furthest = std::max(furthest, t.sync->applied_steps());
  }
  return furthest;
}

void RowTables::OnPull(Peer& peer, uint64_t request_id, HeldRows& table,
                       const wire::RowsPull& msg) {
  // A sync table's pull waits until the step it asks for is applied (none
  // waits before the first push: no step was pushed to wait for).
  if (table.sync && table.sync->started() && msg.min_step > table.sync->applied_steps()) {
    return waits_.Hold(peer, request_id, msg);
  }
  pulls_.Serve(peer, request_id, table, msg);
}

size_t RowTables::entries() const {
  size_t rows = 0;
  for (const auto& [id, t] : tables_) rows += t.rows->rows();
  return rows;
}

uint64_t RowTables::held_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [id, t] : tables_) bytes += t.rows->mapped_bytes();
  return bytes;
}

std::vector<wire::Opcode> RowTables::Opcodes() const {
  return {wire::Opcode::kCreateTable, wire::Opcode::kRowsPull, wire::Opcode::kRowsPush};
}

void RowTables::Refuse(Peer& peer, const wire::Header& h, const Status& why) {
  lent_.sessions->SendError(peer, h.request_id,
                            why.WithContext(std::string(wire::OpcodeName(h.opcode)) + " refused"));
}

void RowTables::OnRequest(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame) {
  // As the dense table: a body it cannot accept costs the peer that request.
  auto decoded = [&]<typename Msg>(auto serve) {
    auto m = wire::DecodeBody<Msg>(h, frame);
    if (!m.ok()) return Refuse(peer, h, m.status());
    serve(*m);
  };
  switch (h.opcode) {
    case wire::Opcode::kCreateTable:
      return decoded.operator()<wire::CreateTable>(
          [&](const wire::CreateTable& m) { OnCreate(peer, h.request_id, m); });
    case wire::Opcode::kRowsPull:
      return decoded.operator()<wire::RowsPull>([&](const wire::RowsPull& m) {
        HeldRows* t = Find(peer, h.request_id, m.table_id);
        if (t == nullptr) return;
        if (Status st = t->CheckPlaced(m.ids, placement_, lent_.options->task_index); !st.ok()) {
          return Refuse(peer, h, st);
        }
        OnPull(peer, h.request_id, *t, m);
      });
    case wire::Opcode::kRowsPush:
      return decoded.operator()<wire::RowsPush>([&](const wire::RowsPush& m) {
        HeldRows* t = Find(peer, h.request_id, m.table_id);
        if (t == nullptr) return;
        if (Status st = t->CheckPlaced(m.ids, placement_, lent_.options->task_index); !st.ok()) {
          return Refuse(peer, h, st);
        }
        if (!pushes_.Serve(peer, h.request_id, *t, m)) return;
        waits_.Release(m.table_id, t->sync->applied_steps(),
                       [&](Peer& p, uint64_t id, const wire::RowsPull& pull) {
                         pulls_.Serve(p, id, *t, pull);
                       });
      });
    default:
      return lent_.sessions->Drop(peer,
                                  Status::Internal(std::string(wire::OpcodeName(h.opcode)) +
                                                   " handed to the embedding tables, which do "
                                                   "not serve it"),
                                  h.request_id);
  }
}

HeldRows* RowTables::Find(Peer& peer, uint64_t request_id, uint32_t table_id) {
  auto it = tables_.find(table_id);
  if (it != tables_.end()) return &it->second;
  lent_.sessions->SendError(peer, request_id,
                            Status::NotFound("no embedding table has id " +
                                             std::to_string(table_id) + " on this ps task"));
  return nullptr;
}

Result<HeldRows> RowTables::Make(const wire::CreateTable& msg) const {
  const wire::EmbeddingDecl& d = msg.table;
  const std::string who = "embedding table '" + d.name + "'";
  if (d.mode.kind == Consistency::kBounded) {
    return Status::Unimplemented(who +
                                 ": bounded embedding tables are not served yet; declare it "
                                 "async or sync");
  }
  auto rows = embed::RowStore::Make({.table = d.name,
                                     .rule = {d.rule, d.dtype, d.hyper, d.ftrl},
                                     .dim = d.dim,
                                     .initializer = d.initializer,
                                     .max_rows = d.max_rows_per_shard});
  if (!rows.ok()) return rows.status();
  // Every table's limit together, against what this process may still take.
  uint64_t promised = d.max_rows_per_shard * (*rows)->stride();
  for (const auto& [id, t] : tables_) promised += t.decl.max_rows_per_shard * t.rows->stride();
  const uint64_t available = AvailableHostMemory();
  if (available != 0 && promised > available) {
    return Status::ResourceExhausted(
        who + ": " + std::to_string(d.max_rows_per_shard) + " rows per ps task of " +
        std::to_string((*rows)->stride()) + " bytes, with this task's other tables, need " +
        std::to_string(promised) + " bytes; " + std::to_string(available) +
        " are available here (lower max_rows_per_shard)");
  }
  HeldRows held{msg.table_id, d, std::move(*rows), nullptr};
  if (d.mode.kind == Consistency::kSync) {
    held.sync =
        std::make_unique<SyncRowSteps>(d.mode.replicas_to_aggregate, d.mode.total_num_replicas,
                                       d.mode.average, d.dim, d.max_rows_per_shard);
  }
  return held;
}

void RowTables::OnCreate(Peer& peer, uint64_t request_id, const wire::CreateTable& msg) {
  if (auto it = tables_.find(msg.table_id); it != tables_.end()) {
    if (it->second.decl.name != msg.table.name || !(it->second.decl == msg.table)) {
      return lent_.sessions->SendError(
          peer, request_id,
          Status::FailedPrecondition("table id " + std::to_string(msg.table_id) + " is " +
                                     it->second.Describe() + " here, declared otherwise than " +
                                     "embedding table '" + msg.table.name + "' now"));
    }
    return lent_.sessions->Reply(peer, request_id, wire::Ack{});
  }
  auto made = Make(msg);
  if (!made.ok()) return lent_.sessions->SendError(peer, request_id, made.status());
  TLOG_INFO("{} created: {} rule, at most {} rows here", made->Describe(),
            UpdateRuleName(msg.table.rule), msg.table.max_rows_per_shard);
  tables_.emplace(msg.table_id, std::move(*made));
  lent_.sessions->Reply(peer, request_id, wire::Ack{});
}

Result<bool> RowTables::BeginCut(CutRound*) {
  if (tables_.empty()) return true;
  return Status::Unimplemented(tables_.begin()->second.Describe() +
                               ": checkpoints do not hold embedding tables yet, and one "
                               "without them would restore a model that lost its rows");
}

}  // namespace tessera::server
