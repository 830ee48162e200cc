// The ps tasks' joins to a coordinator that (re)started: each is answered
// once every ps task joined since, so that the global step it hears (where
// restored sync chunks resume) is the rebuilt one; after that, at once.
// Holds at most one join per ps task (a newer one replaces the older) and
// the hosted task's. Progress thread only.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coord/peer_ref.h"
#include "wire/messages.h"

namespace tessera::coord {

class JoinGate {
 public:
  using LocalAnswer = std::function<void(const wire::JoinReply&)>;
  // The joins held until every ps task joined, to answer with one reply.
  struct Held {
    std::map<int, std::pair<PeerId, uint64_t>> remote;  // ps task -> its link, request id
    LocalAnswer local;                                  // the hosted task's, if held
  };

  explicit JoinGate(int num_shards) : joined_once_(static_cast<size_t>(num_shards), false) {}

  void Joined(int shard) { joined_once_[static_cast<size_t>(shard)] = true; }
  bool all_joined() const {
    for (bool joined : joined_once_) {
      if (!joined) return false;
    }
    return true;
  }
  bool open() const { return open_; }
  // "ps 1, ps 3": the tasks not joined yet.
  std::string Missing() const {
    std::string missing;
    for (size_t k = 0; k < joined_once_.size(); ++k) {
      if (!joined_once_[k]) missing += (missing.empty() ? "ps " : ", ps ") + std::to_string(k);
    }
    return missing;
  }
  void HoldRemote(int shard, PeerId link, uint64_t request_id) {
    remote_[shard] = {link, request_id};
  }
  void HoldLocal(LocalAnswer answer) { local_ = std::move(answer); }
  // Every ps task joined: the gate opens (for good), handing over what it held.
  Held Open() {
    open_ = true;
    Held held{std::move(remote_), std::move(local_)};
    remote_.clear();
    local_ = nullptr;
    return held;
  }
  void Forget(PeerId peer) {
    std::erase_if(remote_, [&](const auto& w) { return w.second.first == peer; });
  }

 private:
  std::vector<bool> joined_once_;  // per ps task, since the service started
  std::map<int, std::pair<PeerId, uint64_t>> remote_;
  LocalAnswer local_;
  bool open_ = false;
};

}  // namespace tessera::coord
