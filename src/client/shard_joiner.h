// Joins a client's shards and joins them again: connects, runs the
// handshake (hello, challenge, welcome: wire/handshake.h) and takes what the
// welcome lends; at the start, waits for each shard with growing pauses
// while its task starts; later, a lost shard is tried again now and then,
// and once it answers this worker's chunks are created on it again (a
// restarted shard restores them from the newest checkpoint). Loop thread,
// except JoinAll.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "client/call_counters.h"
#include "client/shard_links.h"
#include "client/startup_waiter.h"
#include "client/tensor_table.h"
#include "tessera/client.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace tessera::client {

class ShardJoiner {
 public:
  // Who this client says it is in its hellos.
  struct Identity {
    uint32_t task_index = 0;  // the worker's rank (0 for a reader)
    std::string ipc_node_id;  // set when this worker can use CUDA IPC
  };
  // `handshake_timeout`: the shards' own hello deadline, after which they
  // would have closed the connection anyway.
  ShardJoiner(ShardLinks& links, transport::Context& ctx, const ClientOptions& options,
              Identity identity, std::chrono::milliseconds handshake_timeout, TensorTable& tensors,
              CallCounters& counts);
  // A shard that was lost is back, its chunks created again.
  void SetOnBack(std::function<void(int shard)> on_back) { on_back_ = std::move(on_back); }

  // The starting thread: joins every shard, waiting for those not up yet,
  // until `waiting.deadline`; OK once each welcomed this client.
  Status JoinAll(const StartupWaiter::Options& waiting);
  // A lost shard, tried again (at most once a second, one try at a time).
  void Reconnect(int shard);

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  void Connect(int shard, Deadline deadline);
  // A start's handshake with `shard` ended with `st`: joined, failed, or
  // tried again after a pause while `deadline` allows.
  void OnStartHandshake(int shard, Deadline deadline, const Status& st);
  void OnReconnected(int shard, std::shared_ptr<transport::Endpoint> ep);
  // `done` once: with the error, or OK when welcomed, or when the shard let
  // the hello deadline pass without either.
  void Handshake(int shard, std::function<void(Status)> done);
  // The handshake's last step: the shard's welcome (its staging slot, the
  // session's protection, a CUDA IPC slot) taken.
  Status AcceptWelcome(int shard, const wire::Welcome& welcome,
                       const wire::ClientHandshake& handshake);
  void ReCreate(int shard);
  void OnReCreated(int shard, const Status& st);

  ShardLinks& links_;
  transport::Context& ctx_;
  const ClientOptions& options_;
  const Identity identity_;
  const std::chrono::milliseconds handshake_timeout_;
  TensorTable& tensors_;
  CallCounters& counts_;
  // What the start waits for; it stays while the loop may still report to it.
  std::unique_ptr<StartupWaiter> startup_;
  std::function<void(int shard)> on_back_;
};

}  // namespace tessera::client
