#include "tessera/client.h"

#include "client/client_impl.h"

namespace tessera {

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<Tensor> Client::Declare(const TensorSpec& spec) {
  auto r = impl_->DeclareMany({spec});
  if (!r.ok()) return r.status();
  return r->front();
}

Result<std::vector<Tensor>> Client::DeclareMany(const std::vector<TensorSpec>& specs) {
  return impl_->DeclareMany(specs);
}

Future Client::DeclareAsync(const TensorSpec& spec, Tensor* tensor) {
  if (tensor == nullptr) return impl_->DeclareManyAsync({spec}, nullptr);
  // One handle wanted: the job fills a vector of one, kept by the future's
  // continuation, which hands the handle over before Wait returns.
  auto out = std::make_shared<std::vector<Tensor>>();
  Future f = impl_->DeclareManyAsync({spec}, out.get());
  f.Then([out, tensor](const Status& st) {
    if (st.ok() && !out->empty()) *tensor = out->front();
  });
  return f;
}

Future Client::DeclareManyAsync(const std::vector<TensorSpec>& specs,
                                std::vector<Tensor>* tensors) {
  return impl_->DeclareManyAsync(specs, tensors);
}

Result<Tensor> Client::Find(const std::string& name) const { return impl_->tensors_.Find(name); }

Result<TensorInfo> Client::info(Tensor t) const { return impl_->tensors_.Info(t); }

bool Client::is_chief() const { return impl_->worker_rank_ == 0; }
bool Client::read_only() const { return impl_->options_.read_only; }
uint32_t Client::id() const { return impl_->id_; }
Status Client::Initialize() { return impl_->Initialize(); }
Future Client::InitializeAsync() { return impl_->InitializeAsync(); }
Future Client::WaitForInitAsync(std::chrono::milliseconds timeout) {
  return impl_->WaitForInitAsync(timeout);
}
std::optional<uint64_t> Client::restored_step() const { return impl_->tensors_.restored_step(); }
std::optional<uint64_t> Client::start_step() const { return impl_->tensors_.start_step(); }
Result<Client::CheckpointInfo> Client::SaveCheckpoint(std::chrono::milliseconds timeout) {
  return impl_->SaveCheckpoint(timeout);
}
Result<uint64_t> Client::GlobalStep() { return impl_->GlobalStep(); }
Status Client::SetHyperparams(Tensor t, const Hyperparams& hyper) {
  return impl_->SetHyperparams(t, hyper);
}
Result<Client::OptimizerState> Client::ReadOptimizerState(Tensor t, StateSlot slot) {
  return impl_->ReadOptimizerState(t, slot);
}
Status Client::WriteOptimizerState(Tensor t, StateSlot slot, const OptimizerState& state) {
  return impl_->WriteOptimizerState(t, slot, state);
}
Future Client::ReadOptimizerStateAsync(Tensor t, StateSlot slot, OptimizerState* out) {
  return impl_->control_.Submit([impl = impl_.get(), t, slot, out] {
    auto state = impl->ReadOptimizerState(t, slot);
    if (!state.ok()) return state.status();
    if (out != nullptr) *out = std::move(*state);
    return Status::Ok();
  });
}
Future Client::WriteOptimizerStateAsync(Tensor t, StateSlot slot, OptimizerState state) {
  return impl_->control_.Submit([impl = impl_.get(), t, slot, state = std::move(state)] {
    return impl->WriteOptimizerState(t, slot, state);
  });
}
Future Client::SetHyperparamsAsync(Tensor t, const Hyperparams& hyper) {
  return impl_->control_.Submit(
      [impl = impl_.get(), t, hyper] { return impl->SetHyperparams(t, hyper); });
}
Future Client::GlobalStepAsync(uint64_t* step) {
  return impl_->control_.Submit([impl = impl_.get(), step] {
    auto got = impl->GlobalStep();
    if (got.ok() && step != nullptr) *step = *got;
    return got.status();
  });
}
Future Client::SaveCheckpointAsync(CheckpointInfo* saved, std::chrono::milliseconds timeout) {
  return impl_->control_.Submit([impl = impl_.get(), saved, timeout] {
    auto done = impl->SaveCheckpoint(timeout);
    if (done.ok() && saved != nullptr) *saved = *done;
    return done.status();
  });
}
Status Client::WaitForInit(std::chrono::milliseconds timeout) {
  return impl_->WaitForInit(timeout);
}
Future Client::PushAsync(const std::vector<PushItem>& items, const PushOptions& options) {
  return impl_->Push(items, 0, options.step, options.call);
}
Status Client::Push(const std::vector<PushItem>& items, const PushOptions& options,
                    std::vector<DroppedChunk>* dropped) {
  PushOptions waited = options;
  // Issued on this thread, which waits at once; a stream issues it itself.
  waited.call.caller_waits = options.call.cuda_stream == nullptr;
  Future f = PushAsync(items, waited);
  Status st = f.Wait();
  if (dropped != nullptr) *dropped = f.dropped();
  return st;
}
Future Client::PullAsync(const std::vector<PullItem>& items) { return impl_->Pull(items, {}); }
Future Client::PullAsync(const std::vector<PullItem>& items, const CallOptions& call) {
  return impl_->Pull(items, call);
}
Future Client::PushPullAsync(const std::vector<PushPullItem>& items) {
  return impl_->PushPull(items, {});
}
Future Client::PushPullAsync(const std::vector<PushPullItem>& items, const CallOptions& call) {
  return impl_->PushPull(items, call);
}
Result<Embedding> Client::DeclareEmbedding(const EmbeddingSpec& spec) {
  Result<Embedding> out = Status::Internal("the declare did not run");
  // The job runs before its future completes, so `out` and `spec` outlive it.
  Status st = impl_->control_
                  .Submit([&] {
                    out = impl_->rows().Declare(spec);
                    return out.status();
                  })
                  .Wait();
  if (!st.ok()) return st;
  return out;
}
Future Client::PullRowsAsync(Embedding table, std::span<const int64_t> ids, void* rows,
                             uint64_t min_step) {
  return impl_->rows().Pull(table, ids, rows, min_step);
}
Future Client::PushRowsAsync(Embedding table, std::span<const int64_t> ids, const void* grads,
                             const PushOptions& options) {
  if (options.call.cuda_stream != nullptr) {
    return FailedFuture(Status::InvalidArgument(
        "a push of rows is not ordered on a CUDA stream (call.cuda_stream)"));
  }
  return impl_->rows().Push(table, ids, grads, options.step);
}
int Client::num_shards() const { return impl_->options_.cluster.num_tasks("ps"); }

ClientCounters Client::counters() const {
  auto c = impl_->ctx_->counters();
  ClientCounters out;
  out.messages_sent = c.messages_sent;
  out.message_bytes_sent = c.message_bytes_sent;
  out.messages_received = c.messages_received;
  out.message_bytes_received = c.message_bytes_received;
  out.puts = c.puts;
  out.put_bytes = c.put_bytes;
  out.gets = c.gets;
  out.get_bytes = c.get_bytes;
  out.chunks_dropped_stale = impl_->counts_.dropped_stale;
  out.chunks_dropped_duplicate = impl_->counts_.dropped_duplicate;
  out.cuda_ipc_bytes = impl_->counts_.ipc_bytes;
  out.host_staged_bytes = impl_->counts_.staged_bytes;
  out.gpu_inline_bytes = impl_->counts_.gpu_inline_bytes;
  out.cuda_ipc_shards = impl_->counts_.ipc_shards;
  out.protected_sessions = impl_->counts_.protected_sessions;
  return out;
}

}  // namespace tessera
