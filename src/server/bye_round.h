// A clean stop's farewell: a ps task tells its coordinator, and a
// coordinator its ps tasks, that it stops on purpose, and waits briefly for
// their acks, so that none of them logs a lost peer (or tries to rejoin
// loudly). The server begins the round and waits; the connections that
// were told answer (or end) on the progress thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <vector>

#include "transport/transport.h"

namespace tessera::server {

class ByeRound {
 public:
  // The request id of a bye: its ack is told from any other by it.
  static constexpr uint64_t kRequestId = ~uint64_t{0};

  // Progress thread: a new round, which `answered` hears the end of.
  void Begin(std::shared_ptr<std::promise<void>> answered) {
    awaited_.clear();
    answered_ = std::move(answered);
  }
  // Progress thread: `to` was sent the bye.
  void Await(const transport::Endpoint* to) { awaited_.push_back(to); }
  // Progress thread: every bye was sent; a round that told nobody ends now.
  void AllSent() {
    if (awaited_.empty()) Finish();
  }
  // Progress thread: `from` acked the bye, or its connection ended (it
  // cannot ack any more).
  void Answered(const transport::Endpoint* from) {
    if (!answered_) return;
    std::erase(awaited_, from);
    if (awaited_.empty()) Finish();
  }

 private:
  void Finish() {
    if (!answered_) return;
    answered_->set_value();
    answered_.reset();
  }

  std::vector<const transport::Endpoint*> awaited_;
  std::shared_ptr<std::promise<void>> answered_;  // while a round is open
};

}  // namespace tessera::server
