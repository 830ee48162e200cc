// A rows-push applied: each id's gradient row widened to f32 and checked,
// then its row updated by the table's rule (made first where the id has
// none). A gradient row holding a NaN or an Inf is not applied and is
// counted (the reply says how many). All or nothing where the table's row
// limit is at stake: a push that would make more rows than the limit allows
// is refused before any of its rows is touched. Async tables; progress
// thread.
#pragma once

#include <cstdint>
#include <vector>

#include "server/held_rows.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "wire/row_messages.h"

namespace tessera::server {

class RowsPushApplier {
 public:
  explicit RowsPushApplier(PeerSessions& sessions) : sessions_(sessions) {}
  void Serve(Peer& peer, uint64_t request_id, HeldRows& table, const wire::RowsPush& msg);
  uint64_t rows_applied() const { return rows_applied_; }
  uint64_t nonfinite_rows() const { return nonfinite_rows_; }

 private:
  // Whether the rows the push would make fit the table's limit.
  static Status CheckRoom(HeldRows& table, const wire::RowIds& ids);
  // Row `at` of `grads` into grad_ as f32; false where it is not finite.
  bool Widen(DType dtype, const uint8_t* row, uint32_t dim);

  PeerSessions& sessions_;
  std::vector<float> grad_;  // one row's gradient, kept from push to push
  uint64_t rows_applied_ = 0;
  uint64_t nonfinite_rows_ = 0;
};

}  // namespace tessera::server
