// The Counters of a context, updated from any thread; shared by the backends.
#pragma once

#include <atomic>
#include <cstdint>

#include "transport/transport.h"

namespace tessera::transport {

struct AtomicCounters {
  std::atomic<uint64_t> messages_sent{0}, message_bytes_sent{0}, messages_received{0},
      message_bytes_received{0}, puts{0}, put_bytes{0}, gets{0}, get_bytes{0};

  Counters Snapshot() const {
    Counters c;
    c.messages_sent = messages_sent;
    c.message_bytes_sent = message_bytes_sent;
    c.messages_received = messages_received;
    c.message_bytes_received = message_bytes_received;
    c.puts = puts;
    c.put_bytes = put_bytes;
    c.gets = gets;
    c.get_bytes = get_bytes;
    return c;
  }
};

}  // namespace tessera::transport
