#include "server/tables.h"

#include <string>

namespace tessera::server {

Status Tables::Add(std::unique_ptr<Table> table) {
  for (wire::Opcode op : table->Opcodes()) {
    const auto i = static_cast<size_t>(op);
    if (i >= by_opcode_.size()) {
      return Status::Internal("a table serves opcode " + std::to_string(i) +
                              ", beyond the protocol's");
    }
    if (by_opcode_[i] != nullptr) {
      return Status::Internal(std::string(wire::OpcodeName(op)) + " served by the " +
                              std::string(by_opcode_[i]->kind()) + " table and the " +
                              std::string(table->kind()) + " table");
    }
    by_opcode_[i] = table.get();
  }
  tables_.push_back(std::move(table));
  return Status::Ok();
}

Result<size_t> Tables::BeginCut(CutRound* round) {
  size_t later = 0;
  for (auto& t : tables_) {
    auto all_now = t->BeginCut(round);
    if (!all_now.ok()) {
      DropCut();
      return all_now.status();
    }
    if (!*all_now) ++later;
  }
  return later;
}

}  // namespace tessera::server
