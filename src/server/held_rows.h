// One embedding table as a ps task holds it: its declaration, its rows,
// and what the requests that name it are checked against (which ids are
// this task's, how many bytes a row takes). Progress thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/row_placement.h"
#include "embed/row_store.h"
#include "server/sync_row_steps.h"
#include "tessera/status.h"
#include "wire/row_messages.h"

namespace tessera::server {

struct HeldRows {
  uint32_t table_id = 0;
  wire::EmbeddingDecl decl;
  std::unique_ptr<embed::RowStore> rows;
  std::unique_ptr<SyncRowSteps> sync;  // sync tables only

  // An error naming the first id of `ids` another ps task holds, or OK.
  Status CheckPlaced(std::span<const int64_t> ids, const RowPlacement& placement,
                     int this_task) const;
  std::string Describe() const;  // "embedding table 'user' (dim 8, f32)"
};

}  // namespace tessera::server
