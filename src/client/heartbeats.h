// A client's heartbeats: every interval, a ping to each shard it is joined
// to, a lost shard tried again, and a shard silent for the whole timeout of
// listening declared lost (silence_meter.h). Loop thread, after Start.
#pragma once

#include <chrono>
#include <string>

#include "client/shard_links.h"
#include "transport/transport.h"

namespace tessera::client {

class Heartbeats {
 public:
  // `task`: this client's, for the log.
  Heartbeats(ShardLinks& links, transport::Context& ctx, std::string task,
             std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
      : links_(links), ctx_(ctx), task_(std::move(task)), interval_(interval), timeout_(timeout) {}

  // Any thread: the meters start now, the first beat after an interval.
  void Start();

 private:
  void Beat();

  ShardLinks& links_;
  transport::Context& ctx_;
  const std::string task_;
  const std::chrono::milliseconds interval_, timeout_;
  // When the next beat is due: a later one shows that the progress loop
  // was held up.
  std::chrono::steady_clock::time_point next_beat_{};
};

}  // namespace tessera::client
