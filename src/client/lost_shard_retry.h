// Parts of calls retried over a ps task's restart in place
// (ClientOptions::retry_lost_shard_within): a part that failed because its
// shard was lost is held, by shard, until the shard is back and this
// worker's tensors are created on it again, then issued as it was first;
// once its bound passes it fails with the loss. Loop thread only.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/chunk_io.h"
#include "client/future_state.h"
#include "core/inline_function.h"
#include "tessera/client.h"
#include "transport/transport.h"

namespace tessera::client {

class LostShardRetry {
 public:
  // What the client tells it of its shards.
  struct Shards {
    // Whether the shard is lost now (its connection is gone).
    std::function<bool(int shard)> lost;
    // Try the shard again (paced by the client); once it is back and this
    // worker's tensors were created on it again, the client calls ShardBack.
    std::function<void(int shard)> reconnect;
    std::function<std::string(int shard)> name;
  };
  // Issues the part (again), its chunks as first given; `done` once.
  using Issue = std::function<void(PartDone done)>;

  // `bound`: retry_lost_shard_within (above 0).
  LostShardRetry(transport::Context& ctx, std::chrono::milliseconds bound, size_t num_shards,
                 Shards shards);

  // Reads TESSERA_RETRY_LOST_SHARD_MS over `options`' bound, and checks it
  // against the operation timeout.
  static Status TakeBound(ClientOptions* options);

  // Issues a part that may be sent twice, and finishes `op` with its
  // outcome, or holds it while its shard is lost, within the bound.
  void IssuePart(int shard, std::shared_ptr<Future::State> op, Issue issue);
  // The shard is back: its held parts are issued again, in order.
  void ShardBack(int shard);
  // Fails the shard's held parts with `why`.
  void FailHeld(int shard, const Status& why);
  // The client closes: a part that fails from now on is not held.
  void Stop() { stopping_ = true; }

 private:
  struct Part;
  struct Held {
    std::deque<std::shared_ptr<Part>> parts;  // in the order they failed
    bool sweep_scheduled = false;
  };
  void IssueAgain(const std::shared_ptr<Part>& part);
  void OnDone(const std::shared_ptr<Part>& part, const Status& st);
  // Fails held parts whose bound passed, and keeps trying the shard while
  // any wait (a timer, while there are some).
  void Sweep(int shard);
  std::string BoundPassed() const;

  transport::Context& ctx_;
  const std::chrono::milliseconds bound_;
  const Shards shards_;
  std::vector<Held> held_;  // by shard
  bool stopping_ = false;
};

}  // namespace tessera::client
