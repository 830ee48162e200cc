#include "coord/held_requests.h"

#include <string>

namespace tessera::coord {

Status HeldRequests::Hold(const WorkerRef& from, const wire::Header& h,
                          std::span<const uint8_t> frame) {
  if (held_.size() >= max_requests_ || bytes_ + frame.size() > max_bytes_) {
    return Status::Unavailable("the coordinator is waiting for ps tasks to join, and " +
                               std::to_string(held_.size()) + " requests (" +
                               std::to_string(bytes_) + " bytes) wait already");
  }
  bytes_ += frame.size();
  held_.push_back({from, h, CopyToMessage(frame)});
  return Status::Ok();
}

HeldRequests::Request HeldRequests::Take() {
  Request r = std::move(held_.front());
  held_.pop_front();
  bytes_ -= r.frame.size();
  return r;
}

void HeldRequests::Forget(PeerId peer) {
  std::erase_if(held_, [&](const Request& r) {
    if (r.from.peer != peer) return false;
    bytes_ -= r.frame.size();
    return true;
  });
}

void HeldRequests::Clear() {
  held_.clear();
  bytes_ = 0;
}

}  // namespace tessera::coord
