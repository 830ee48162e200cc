// Worker requests that came before the coordinator could answer them (ps
// tasks still joining), held in order until it can. They are the peers'
// bytes: bounded in number and in size. Progress thread only.
#pragma once

#include <cstddef>
#include <deque>
#include <span>

#include "coord/peer_ref.h"
#include "core/bytes.h"
#include "tessera/status.h"
#include "wire/header.h"

namespace tessera::coord {

class HeldRequests {
 public:
  struct Request {
    WorkerRef from;
    wire::Header header;
    MessageBytes frame;
  };
  HeldRequests(size_t max_requests, size_t max_bytes)
      : max_requests_(max_requests), max_bytes_(max_bytes) {}

  bool empty() const { return held_.empty(); }
  // A copy of the request, held; Unavailable when the bounds are reached.
  Status Hold(const WorkerRef& from, const wire::Header& h, std::span<const uint8_t> frame);
  // The oldest, handed over.
  Request Take();
  void Forget(PeerId peer);
  void Clear();

 private:
  const size_t max_requests_, max_bytes_;
  std::deque<Request> held_;
  size_t bytes_ = 0;
};

}  // namespace tessera::coord
