// A context's message handlers, and the one place where a received message
// finds its handler. Shared by the backends. Handlers are set before any
// connection exists and only read afterwards, so lookups need no lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "core/log_throttle.h"
#include "transport/transport.h"

namespace tessera::transport {

class MessageHandlers {
 public:
  explicit MessageHandlers(std::string context_name) : name_(std::move(context_name)) {}

  // Ids at or above Context::kMaxUserMessageId belong to the backends (UCX's
  // connect messages): a handler for one would never run, so setting it is a
  // programming error that stops the process, naming the id.
  void Set(uint16_t msg_id, MessageHandler handler);

  // Runs the handler of `msg_id`; a message that no handler takes is dropped
  // and logged, at most 10 lines a minute (the id comes from the peer, who
  // may not have authenticated yet). Progress thread only.
  void Dispatch(const std::shared_ptr<Endpoint>& from, uint16_t msg_id,
                std::span<const uint8_t> bytes) const;

 private:
  const std::string name_;
  std::unordered_map<uint16_t, MessageHandler> handlers_;
  mutable LogThrottle unknown_log_{10, std::chrono::minutes(1)};
};

}  // namespace tessera::transport
