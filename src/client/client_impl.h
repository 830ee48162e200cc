// Client::Impl, the worker's side: the public API's calls, over units that
// each own their part (docs/architecture.md): the links to the shards
// (ShardLinks, joined by ShardJoiner, kept by Heartbeats), the tensor table,
// the data calls' split and fan-out (SplitByShard, FanOut) and their movers
// (PushSender, PullReceiver, GpuAccess). Files: client_impl.cc (start and
// end), data_calls.cc (push, pull, push_pull), declare.cc, row_calls.cc
// (embedding tables),
// coordinator_calls.cc, optimizer_state.cc, client.cc (the public API).
// What the units' headers call the loop thread is the transport's progress
// thread, or a caller's thread while it drives the loop (Future::Wait).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/call_counters.h"
#include "client/control_queue.h"
#include "client/fan_out.h"
#include "client/gpu_access.h"
#include "client/heartbeats.h"
#include "client/pull_receiver.h"
#include "client/push_sender.h"
#include "client/row_calls.h"
#include "client/shard_joiner.h"
#include "client/shard_links.h"
#include "client/tensor_table.h"
#include "tessera/client.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera {

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {}
  ~Impl();

  // This client's id (Client::id()), which its Tensors carry.
  const uint32_t id_ = NextId();
  static uint32_t NextId();

  Status Start();
  // The control calls, on the control queue (control_queue.h): blocking
  // forms wait for theirs, so that both are ordered alike.
  Result<std::vector<Tensor>> DeclareMany(const std::vector<TensorSpec>& specs);
  Future DeclareManyAsync(std::vector<TensorSpec> specs, std::vector<Tensor>* tensors);
  Status Initialize() {
    return control_.Submit([this] { return InitializeNow(); }).Wait();
  }
  Future InitializeAsync() {
    return control_.Submit([this] { return InitializeNow(); });
  }
  Status WaitForInit(std::chrono::milliseconds timeout) { return WaitForInitAsync(timeout).Wait(); }
  Future WaitForInitAsync(std::chrono::milliseconds timeout) {
    return control_.Submit([this, timeout] { return WaitForInitNow(timeout); });
  }
  Status SetHyperparams(Tensor t, const Hyperparams& hyper);
  // optimizer_state.cc: a tensor's optimizer state, chunk by chunk.
  Result<Client::OptimizerState> ReadOptimizerState(Tensor t, Client::StateSlot slot);
  Status WriteOptimizerState(Tensor t, Client::StateSlot slot, const Client::OptimizerState& state);
  Result<uint64_t> GlobalStep();
  // Where the tensors the chief initialises now start (InitializeNow).
  Result<uint64_t> StepToStartAt();
  Result<Client::CheckpointInfo> SaveCheckpoint(std::chrono::milliseconds timeout);
  // `step`: the worker's step; none for a push without one, which sync
  // tensors refuse.
  Future Push(const std::vector<PushItem>& items, uint32_t flags, std::optional<uint64_t> step,
              const CallOptions& call);
  Future Pull(const std::vector<PullItem>& items, const CallOptions& call);
  Future PushPull(const std::vector<PushPullItem>& items, const CallOptions& call);
  // Embedding tables (row_calls.h); their declare is a control call.
  client::RowCalls& rows() { return *rows_; }

  ClientOptions options_;
  int worker_rank_ = 0;  // -1 for a read-only client
  std::unique_ptr<transport::Context> ctx_;
  client::ControlQueue control_;
  client::CallCounters counts_;
  client::TensorTable tensors_{id_};

 private:
  // The control calls themselves, on the control queue's thread.
  Result<std::vector<Tensor>> DeclareNow(const std::vector<TensorSpec>& specs);
  Status InitializeNow();
  Status WaitForInitNow(std::chrono::milliseconds timeout);
  // Start's parts: the context opened, the units made over it.
  Status OpenContext(std::chrono::milliseconds handshake_timeout);
  // What a read-only client says when asked to write: `what` ("push").
  Status ReadOnlyRefusal(const std::string& what) const {
    return Status::FailedPrecondition(options_.task.ToString() +
                                      " is a read-only client: it cannot " + what +
                                      " (ClientOptions::read_only)");
  }

  // Made by Start, in this order (each uses those before it); the loop
  // thread's, except where their headers say.
  std::unique_ptr<client::ShardLinks> links_;
  std::unique_ptr<client::GpuAccess> gpu_;
  std::unique_ptr<client::ShardJoiner> joiner_;
  std::unique_ptr<client::Heartbeats> heartbeats_;
  std::unique_ptr<client::FanOut> fan_out_;
  std::unique_ptr<client::PushSender> sender_;
  std::unique_ptr<client::PullReceiver> receiver_;
  std::unique_ptr<client::RowCalls> rows_;
};

}  // namespace tessera
