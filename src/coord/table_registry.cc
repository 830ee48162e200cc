#include "coord/table_registry.h"

namespace tessera::coord {
namespace {

// The first field that shapes a table's rows in which `a` and `b` differ,
// or null.
const char* FirstDifference(const wire::EmbeddingDecl& a, const wire::EmbeddingDecl& b) {
  if (a.dim != b.dim) return "dim";
  if (a.dtype != b.dtype) return "dtype";
  if (a.rule != b.rule) return "rule";
  if (!(a.initializer == b.initializer)) return "initializer";
  if (!(a.mode == b.mode)) return "consistency mode";
  if (a.max_rows_per_shard != b.max_rows_per_shard) return "max_rows_per_shard";
  return nullptr;
}

}  // namespace

Result<wire::DeclareTableReply> TableRegistry::Declare(const wire::EmbeddingDecl& table,
                                                       const std::string& who) {
  if (auto it = id_of_.find(table.name); it != id_of_.end()) {
    const Declared& first = tables_[it->second - 1];
    if (const char* field = FirstDifference(first.decl, table)) {
      return Status::InvalidArgument("embedding table '" + table.name + "' declared by " + who +
                                     " with another " + field + " than " + first.declared_by +
                                     " declared it with");
    }
    return wire::DeclareTableReply{it->second, first.decl};
  }
  if (tables_.size() >= kMaxTables) {
    return Status::ResourceExhausted("embedding table '" + table.name + "' declared by " + who +
                                     ": the cluster holds its limit of " +
                                     std::to_string(kMaxTables) + " tables");
  }
  tables_.push_back({table, who});
  const auto id = static_cast<uint32_t>(tables_.size());
  id_of_.emplace(table.name, id);
  return wire::DeclareTableReply{id, table};
}

}  // namespace tessera::coord
