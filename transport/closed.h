// What an operation on a closed connection reports, the same for every
// backend: the peer, and why the connection ended where that is known.
#pragma once

#include <string>

#include "tessera/status.h"

namespace tessera::transport {

inline Status ClosedStatus(const std::string& peer, const Status& reason) {
  if (reason.ok()) return Status::Unavailable("connection to " + peer + " is closed");
  return Status(reason.code(), "connection to " + peer + " is closed: " + reason.message());
}

}  // namespace tessera::transport
