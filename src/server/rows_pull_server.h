// A rows-pull answered: each id's row, or for an id that has none its
// initial value (which depends on the id alone, so nothing is stored for
// it), in the pull's order, in one reply. Progress thread.
#pragma once

#include <cstdint>

#include "server/held_rows.h"
#include "server/peer.h"
#include "server/peer_sessions.h"
#include "wire/row_messages.h"

namespace tessera::server {

class RowsPullServer {
 public:
  explicit RowsPullServer(PeerSessions& sessions) : sessions_(sessions) {}
  void Serve(Peer& peer, uint64_t request_id, HeldRows& table, const wire::RowsPull& msg);
  uint64_t rows_served() const { return rows_served_; }

 private:
  PeerSessions& sessions_;
  wire::RowsPullReply reply_;  // its bytes keep their capacity from pull to pull
  uint64_t rows_served_ = 0;
};

}  // namespace tessera::server
