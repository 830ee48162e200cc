// What every backend's endpoint gets unless it does better: a batch of
// one-sided operations issued one by one, completed once.
#include <atomic>
#include <mutex>

#include "core/pool_allocator.h"
#include "transport/transport.h"

namespace tessera::transport {
namespace {

// Counts a batch's operations down to its one completion. Completions run
// on the progress thread, except a refusal that a backend reports at once on
// the calling thread (a put outside the region), so the count is atomic.
struct BatchCompletion : Pooled {
  explicit BatchCompletion(size_t n, Completion d) : left(n), done(std::move(d)) {}

  void One(const Status& st) {
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_failure.ok()) first_failure = st;
    }
    // The last one sees every other's failure: each wrote it before its
    // release here.
    if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    Completion finish = std::move(done);
    Status outcome = std::move(first_failure);
    delete this;
    finish(std::move(outcome));
  }

  std::atomic<size_t> left;
  std::mutex mu;
  Status first_failure;  // guarded by mu until the last completion
  Completion done;
};

template <typename Issue>
void OneByOne(std::span<const RmaPiece> pieces, Completion done, const Issue& issue) {
  if (pieces.empty()) return done(Status::Ok());
  // Counted in full before the first is issued: one may complete at once.
  auto* batch = new BatchCompletion(pieces.size(), std::move(done));
  for (const RmaPiece& piece : pieces) {
    issue(piece, [batch](const Status& st) { batch->One(st); });
  }
}

}  // namespace

Status Endpoint::ProtectSession(const SessionKeys&) {
  return Status::Unimplemented("this fabric (" + DescribeLanes() +
                               ") does not protect sessions; only Tessera's tcp does");
}

void Endpoint::PutMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                       Completion done) {
  OneByOne(pieces, std::move(done), [&](const RmaPiece& piece, Completion one) {
    Put(piece.local, piece.len, remote, piece.remote_addr, std::move(one));
  });
}

void Endpoint::GetMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                       Completion done) {
  OneByOne(pieces, std::move(done), [&](const RmaPiece& piece, Completion one) {
    Get(piece.local, piece.len, remote, piece.remote_addr, std::move(one));
  });
}

}  // namespace tessera::transport
