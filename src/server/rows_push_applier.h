// A rows-push applied: each id's gradient row widened to f32 and checked,
// then its row updated by the table's rule (made first where the id has
// none). A gradient row holding a NaN or an Inf is not applied and is
// counted (the reply says how many). All or nothing where the table's row
// limit is at stake: a push that would make more rows than the limit allows
// is refused before any of its rows is touched. A sync table's rows are
// held by its SyncRowSteps until their step has its workers, then applied
// once per row. Progress thread.
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
  // True when a sync step applied (pulls waiting for it may go on).
  bool Serve(Peer& peer, uint64_t request_id, HeldRows& table, const wire::RowsPush& msg);
  uint64_t rows_applied() const { return rows_applied_; }
  uint64_t nonfinite_rows() const { return nonfinite_rows_; }

 private:
  // Whether the rows the push would make fit the table's limit.
  static Status CheckRoom(HeldRows& table, const wire::RowIds& ids);
  void ApplyNow(Peer& peer, uint64_t request_id, HeldRows& table, const wire::RowsPush& msg);
  bool HoldForStep(Peer& peer, uint64_t request_id, HeldRows& table, const wire::RowsPush& msg);
  // Applies the sync table's steps that have their workers; how many rows
  // could not be made (the table's limit), counted into `reply`.
  bool ApplyReadySteps(HeldRows& table, wire::RowsPushReply* reply);
  // Row `at` of `grads` into grad_ as f32; false where it is not finite.
  bool Widen(DType dtype, const uint8_t* row, uint32_t dim);

  PeerSessions& sessions_;
  std::vector<float> grad_;  // one row's gradient, kept from push to push
  // A sync push's finite rows, as f32, and their ids.
  std::vector<float> held_grads_;
  std::vector<int64_t> held_ids_;
  uint64_t rows_applied_ = 0;
  uint64_t nonfinite_rows_ = 0;
};

}  // namespace tessera::server
