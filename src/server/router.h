// What a server's connections ask, routed to the role that serves it. Before
// a peer authenticated only the handshake is read (PeerSessions); then a ps
// task's link goes to the coordinator hosted here, an observer gets status,
// and a worker's or reader's requests go to the coordinator or the shard by
// opcode, refused by name where this task lacks the role. A peer's arrival
// and end are told to the roles that keep state about it. Progress thread
// only, but for the counter.
#pragma once

#include <atomic>
#include <functional>
#include <span>
#include <string>

#include "server/bye_round.h"
#include "server/coordinator_host.h"
#include "server/peer_sessions.h"
#include "server/shard.h"
#include "server/worker_roster.h"
#include "server/workers_leaving.h"

namespace tessera::server {

class Router {
 public:
  // The server's parts; each outlives the router. Null: this task lacks it.
  struct Parts {
    PeerSessions* sessions = nullptr;
    CoordinatorHost* coordinator = nullptr;
    Shard* shard = nullptr;
    ByeRound* bye = nullptr;
    WorkerRoster* roster = nullptr;
    WorkersLeaving* leaving = nullptr;         // stop_when_workers_leave only
    std::function<std::string()> status_json;  // what `tessera status` shows
  };
  explicit Router(Parts parts) : parts_(std::move(parts)) {}

  void OnMessage(const EndpointPtr& ep, std::span<const uint8_t> frame);
  // PeerSessions' events: an authenticated worker, and a connection's end.
  Status OnWorkerJoins(Peer& peer, wire::Welcome* welcome);
  void OnDisconnect(const EndpointPtr& ep, const Status& why);
  // Step reports that came from workers: the shards count steps, so none
  // should (any thread).
  uint64_t step_messages_from_workers() const {
    return step_messages_from_workers_.load(std::memory_order_relaxed);
  }

 private:
  // A ps task's link to the coordinator hosted here.
  void OnPsLinkMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  void OnObserverMessage(Peer& peer, const wire::Header& h);
  // What a reader may not ask for, refused by name; OK for what it may.
  static Status ReaderMay(const Peer& peer, wire::Opcode op);
  void OnWorkerMessage(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  // A worker's connection ended: logged, and counted out. Whether its rank
  // lost its last connection.
  bool OnWorkerLeft(const Peer& peer, const Status& why);
  template <typename Msg>
  static void Reply(Peer& peer, uint64_t request_id, const Msg& msg) {
    peer.ep->Send(wire::kProtocolMsg, wire::Encode(msg, request_id));
  }

  const Parts parts_;
  std::atomic<uint64_t> step_messages_from_workers_{0};
};

}  // namespace tessera::server
