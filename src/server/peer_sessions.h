// A server's connections up to what they ask: each accepted connection is
// admitted or refused (Admission: the cluster's hosts before strangers,
// strangers' guesses bounded), runs the handshake that proves it knows the
// secret and says what it is (a worker, a reader, an observer, a ps task's
// link), and is refused, told why, or forgotten when it ends. What an
// authenticated peer asks is its role's handler's (the server routes it).
// Progress thread only, but for refused().
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>

#include "core/log_throttle.h"
#include "server/admission.h"
#include "server/peer.h"
#include "tessera/server.h"

namespace tessera::server {

class PeerSessions {
 public:
  struct Options {
    const ServerOptions* server = nullptr;  // outlives the sessions
    std::string reader_key;                 // ReaderKey(secret): what readers prove
    uint32_t hello_index = 0;               // this task's, as the handshake names it
    bool hosts_coordinator = false;         // ps tasks may join it
  };
  struct Events {
    // An authenticated worker: what its role gives it into the welcome (a
    // shard's staging slot), and its arrival counted. An error refuses it.
    std::function<Status(Peer&, wire::Welcome*)> worker_joins;
    // A peer's connection ended, or it was refused: whatever serves it
    // forgets it, then Forget(ep).
    std::function<void(const EndpointPtr&, const Status&)> ended;
  };
  PeerSessions(transport::Context& ctx, Options options, Events events)
      : ctx_(ctx), options_(std::move(options)), events_(std::move(events)) {}

  // The admission table, sized to the descriptors this process may hold.
  Status Open();
  void Accept(const EndpointPtr& ep);
  Peer* Find(const transport::Endpoint* ep) {
    auto it = peers_.find(const_cast<transport::Endpoint*>(ep));
    return it == peers_.end() ? nullptr : it->second.get();
  }
  // A frame of a peer that has not authenticated: only the handshake's.
  void OnHandshakeFrame(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  // Refuses the peer: forgets it and, when `tell`, sends it `why` first.
  void Drop(Peer& peer, const Status& why, uint64_t request_id = 0, bool tell = true);
  void SendError(Peer& peer, uint64_t request_id, const Status& st);
  template <typename Msg>
  void Reply(Peer& peer, uint64_t request_id, const Msg& msg) {
    peer.ep->Send(wire::kProtocolMsg, wire::Encode(msg, request_id));
  }
  // The peer's end, once its handlers forgot it.
  void Forget(const EndpointPtr& ep);
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [raw, peer] : peers_) fn(*peer);
  }
  // Stopping: every connection is closed; the peers are handed over, to be
  // freed once the progress thread stopped (a late put over tcp still
  // writes into a staging slot until then).
  std::unordered_map<transport::Endpoint*, std::unique_ptr<Peer>> CloseAll();
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // How long a connection may take to authenticate (from Open on).
  std::chrono::milliseconds hello_deadline() const { return admission_->options().hello_deadline; }

 private:
  Status OnHello(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  Status OnAuth(Peer& peer, const wire::Header& h, std::span<const uint8_t> frame);
  // Whether an authenticated hello may join as what it claims.
  Status CheckClaims(const wire::Hello& hello) const;
  Status CheckReaderClaims(const wire::Hello& hello) const;
  // Sends the welcome, then seals the session where the welcome says so.
  Status SendWelcome(Peer& peer, uint64_t request_id, const wire::Welcome& welcome);
  void ScheduleSweep(std::chrono::milliseconds after);
  // Closes connections that did not authenticate in time.
  void DropOverdue();
  std::string Self() const;  // "ps task 0", as errors name this task
  // An error for the peer, named by this task.
  MessageBytes ErrorFrame(const Status& st, uint64_t request_id) const;
  const ServerOptions& server() const { return *options_.server; }

  transport::Context& ctx_;
  const Options options_;
  const Events events_;
  std::unordered_map<transport::Endpoint*, std::unique_ptr<Peer>> peers_;
  std::unique_ptr<Admission> admission_;
  // Refused connections told why, left for the peer to close until then.
  std::deque<std::pair<EndpointPtr, std::chrono::steady_clock::time_point>> closing_;
  bool overdue_sweep_scheduled_ = false;
  bool stopping_ = false;
  uint64_t accepted_since_trim_ = 0;  // connections since the heap was last trimmed
  // At most 10 lines a minute about refused strangers.
  LogThrottle refusal_log_{10, std::chrono::minutes(1)};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace tessera::server
