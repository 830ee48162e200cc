#include "transport/message_handlers.h"

#include <cstdlib>

#include "core/log.h"

namespace tessera::transport {

void MessageHandlers::Set(uint16_t msg_id, MessageHandler handler) {
  if (msg_id >= Context::kMaxUserMessageId) {
    TLOG_ERROR("{}: message id {} is reserved for the transport (ids from {} up): no handler set",
               name_, msg_id, Context::kMaxUserMessageId);
    std::abort();
  }
  handlers_[msg_id] = std::move(handler);
}

void MessageHandlers::Dispatch(const std::shared_ptr<Endpoint>& from, uint16_t msg_id,
                               std::span<const uint8_t> bytes) const {
  auto handler = handlers_.find(msg_id);
  if (handler == handlers_.end()) {
    uint64_t held_back = 0;
    if (unknown_log_.Allow(LogThrottle::Clock::now(), &held_back)) {
      TLOG_WARN("{}: no handler for message {} from {}; dropped{}", name_, msg_id, from->peer(),
                held_back == 0 ? "" : " (and " + std::to_string(held_back) + " more, not logged)");
    }
    return;
  }
  handler->second(from, bytes);
}

}  // namespace tessera::transport
