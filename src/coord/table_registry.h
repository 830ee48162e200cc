// The embedding tables a cluster declared: each name's id, given in the
// order of first declaration so that every worker and ps task names a
// table by the same number, and its declaration. A later declaration of a
// name must agree with the first on everything that shapes its rows
// (dim, dtype, rule, initializer, mode, row limit), or it is refused naming
// the field; the first declaration's hyper-parameters stay in effect and
// are returned. Progress thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessera/status.h"
#include "wire/row_messages.h"

namespace tessera::coord {

class TableRegistry {
 public:
  // Bounds what declares can make the coordinator hold.
  static constexpr size_t kMaxTables = wire::kMaxEmbeddingTables;

  Result<wire::DeclareTableReply> Declare(const wire::EmbeddingDecl& table, const std::string& who);
  size_t size() const { return tables_.size(); }

 private:
  struct Declared {
    wire::EmbeddingDecl decl;
    std::string declared_by;
  };
  std::map<std::string, uint32_t, std::less<>> id_of_;
  std::vector<Declared> tables_;  // table id - 1
};

}  // namespace tessera::coord
