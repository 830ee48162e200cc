// rows-pulls of sync tables held until their table has applied the step
// they ask for (min_step), or until their wait ends: then the puller hears
// DeadlineExceeded saying which workers have not completed the step. A
// puller that goes takes its held pulls with it. Progress thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>

#include "server/peer.h"
#include "server/peer_sessions.h"
#include "transport/transport.h"
#include "wire/row_messages.h"

namespace tessera::server {

class RowsPullWaits {
 public:
  struct Lent {
    transport::Context* ctx = nullptr;
    PeerSessions* sessions = nullptr;
    // What step `step` of table `table_id` waits for, for the error.
    std::function<std::string(uint32_t table_id, uint64_t step)> missing;
  };
  explicit RowsPullWaits(Lent lent) : lent_(std::move(lent)) {}

  // Pulls held at once, over every peer: each may name 65,536 ids and wait
  // without a deadline of its own (wait_ms 0), so a worker cannot make the
  // shard hold more than this many; one beyond is refused.
  static constexpr size_t kMaxHeld = 4096;
  void Hold(Peer& peer, uint64_t request_id, wire::RowsPull msg);
  // Hands each pull of the table that `applied` steps satisfy to
  // `serve(peer, request_id, msg)`, and forgets it.
  template <typename Serve>
  void Release(uint32_t table_id, uint64_t applied, Serve serve);
  void Forget(const Peer& peer);
  void Stop() { stopping_ = true; }
  size_t size() const { return held_.size(); }

 private:
  struct Waiting {
    Peer* peer;
    uint64_t request_id;
    wire::RowsPull msg;
    uint64_t token;
  };
  void Expire(uint64_t token);

  const Lent lent_;
  std::list<Waiting> held_;
  uint64_t next_token_ = 1;
  bool stopping_ = false;
};

template <typename Serve>
void RowsPullWaits::Release(uint32_t table_id, uint64_t applied, Serve serve) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->msg.table_id != table_id || it->msg.min_step > applied) {
      ++it;
      continue;
    }
    Waiting w = std::move(*it);
    it = held_.erase(it);
    serve(*w.peer, w.request_id, w.msg);
  }
}

}  // namespace tessera::server
