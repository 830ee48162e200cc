#include "server/rows_pull_server.h"

#include <cstring>

namespace tessera::server {

void RowsPullServer::Serve(Peer& peer, uint64_t request_id, HeldRows& table,
                           const wire::RowsPull& msg) {
  embed::RowStore& rows = *table.rows;
  const size_t row_bytes = rows.value_bytes();
  if (msg.ids.size() * row_bytes > wire::kMaxRowBytesPerMessage) {
    return sessions_.SendError(
        peer, request_id,
        Status::InvalidArgument(std::to_string(msg.ids.size()) + " rows of " + table.Describe() +
                                " are more than a message's " +
                                std::to_string(wire::kMaxRowBytesPerMessage) +
                                " bytes: the worker splits such a pull"));
  }
  reply_.rows.resize(msg.ids.size() * row_bytes);
  uint8_t* out = reply_.rows.data();
  for (int64_t id : msg.ids) {
    if (embed::RowHeader* row = rows.Find(id)) {
      std::memcpy(out, rows.Value(row), row_bytes);
    } else {
      rows.InitialValue(id, out);
    }
    out += row_bytes;
  }
  rows_served_ += msg.ids.size();
  sessions_.Reply(peer, request_id, reply_);
}

}  // namespace tessera::server
