// Client::Impl's start (the context opened, the units made, every shard
// joined) and its end (the shards told, every call failed, the context
// closed).

#include <atomic>
#include <future>

#include "client/client_impl.h"
#include "core/node_id.h"
#include "core/placement.h"
#include "core/secret.h"
#include "core/timeouts.h"

namespace tessera {

uint32_t Client::Impl::NextId() {
  static std::atomic<uint32_t> last{0};
  uint32_t id = 0;
  while (id == 0) id = last.fetch_add(1, std::memory_order_relaxed) + 1;  // 0 is no client's
  return id;
}

Client::Impl::~Impl() {
  // Control calls still queued fail now; the one running ends as its round
  // trips fail below, and is waited for before the context goes.
  control_.Shutdown(Status::Aborted("the client was destroyed before this call started"));
  if (!ctx_) {
    control_.Join();
    return;
  }
  links_->coordinator().Close();
  fan_out_->StopStreamOrdered();
  links_->SayBye();
  std::promise<void> closed;
  ctx_->Post([this, &closed] {
    client::LostShardRetry* retry = fan_out_->retry();
    if (retry != nullptr) retry->Stop();
    links_->CloseAll([retry](int shard, const Status& why) {
      if (retry != nullptr) retry->FailHeld(shard, why);
    });
    closed.set_value();
  });
  closed.get_future().wait();
  control_.Join();
  fan_out_->StopDriving();
  ctx_.reset();
}

namespace {

// This client's worker rank, or -1 for a read-only client, once its task,
// spec and secret fit what it is.
Result<int> RankOf(const ClientOptions& o) {
  const TaskId& task = o.task;
  if (!o.read_only) {
    TESSERA_RETURN_IF_ERROR(o.cluster.Validate());
    if (IsReaderKey(o.secret)) {
      return Status::InvalidArgument(
          "the secret given to " + task.ToString() +
          " is a reader key, which lets read-only clients in (ClientOptions::read_only); a "
          "worker needs the cluster secret");
    }
    return o.cluster.worker_rank(task);
  }
  // A reader has no rank, and needs no workers in its spec: only the tasks
  // it reads from.
  if (o.cluster.num_tasks("ps") == 0)
    return Status::InvalidArgument("cluster spec has no ps tasks");
  if (task.job.empty() || task.index < 0) {
    return Status::InvalidArgument("a read-only client needs a task name, e.g. evaluator 0");
  }
  for (const char* job : {"ps", "worker", "chief", "coordinator"}) {
    if (task.job == job) {
      return Status::InvalidArgument("a read-only client cannot be " + task.ToString() +
                                     ", a task of the cluster; name it another job (e.g. "
                                     "evaluator 0)");
    }
  }
  return -1;
}

// Liveness fits the fabric and the host: the environment may set both
// heartbeat times and the handshake's, and TESSERA_TIMEOUT_SCALE stretches
// them (emulation). Then the other options' bounds.
Status TakeTimeouts(ClientOptions* o, std::chrono::milliseconds* handshake_timeout) {
  auto hb_timeout = TimeoutFromEnv("TESSERA_HEARTBEAT_TIMEOUT_MS", o->heartbeat_timeout);
  if (!hb_timeout.ok()) return hb_timeout.status();
  auto hb_interval = TimeoutFromEnv("TESSERA_HEARTBEAT_INTERVAL_MS", o->heartbeat_interval);
  if (!hb_interval.ok()) return hb_interval.status();
  auto hello = TimeoutFromEnv("TESSERA_HELLO_TIMEOUT_MS", *handshake_timeout);
  if (!hello.ok()) return hello.status();
  o->heartbeat_timeout = *hb_timeout;
  o->heartbeat_interval = *hb_interval;
  *handshake_timeout = *hello;
  if (o->heartbeat_timeout.count() > 0 && o->heartbeat_interval.count() <= 0) {
    return Status::InvalidArgument("heartbeat_interval must be above 0 when heartbeats are on");
  }
  if (o->chunk_bytes < 64) return Status::InvalidArgument("chunk_bytes must be at least 64");
  return ParsePlacementPolicy(o->placement).status();
}

}  // namespace

Status Client::Impl::Start() {
  auto rank = RankOf(options_);
  if (!rank.ok()) return rank.status();
  worker_rank_ = *rank;
  TESSERA_RETURN_IF_ERROR(CheckSecretStrength(options_.secret, options_.allow_weak_secret));
  TESSERA_RETURN_IF_ERROR(LogLevelFromEnv().status());
  TESSERA_RETURN_IF_ERROR(client::LostShardRetry::TakeBound(&options_));
  // How long a shard may take to answer the handshake: the shard's own
  // hello deadline (TESSERA_HELLO_TIMEOUT_MS).
  std::chrono::milliseconds handshake_timeout(5000);
  TESSERA_RETURN_IF_ERROR(TakeTimeouts(&options_, &handshake_timeout));
  TESSERA_RETURN_IF_ERROR(OpenContext(handshake_timeout));

  const auto deadline = std::chrono::steady_clock::now() + options_.startup_timeout;
  TESSERA_RETURN_IF_ERROR(joiner_->JoinAll({.task = options_.task.ToString(),
                                            .deadline = deadline,
                                            .startup_timeout = options_.startup_timeout,
                                            .report_interval = options_.report_interval,
                                            .interrupted = options_.interrupted}));
  if (options_.heartbeat_timeout.count() > 0) heartbeats_->Start();
  const bool separate_coordinator = options_.cluster.separate_coordinator();
  TLOG_INFO("{} connected to {} ps task(s){} over {}", options_.task.ToString(),
            options_.cluster.num_tasks("ps"), separate_coordinator ? " and the coordinator" : "",
            ctx_->Describe());
  return Status::Ok();
}

namespace {

// The links: one per ps task, then the coordinator if it runs separately
// (else ps task 0 is the coordinator).
std::vector<client::ShardLink> LinksOf(const ClientOptions& o) {
  const int num_ps = o.cluster.num_tasks("ps");
  const int n = num_ps + (o.cluster.separate_coordinator() ? 1 : 0);
  std::vector<client::ShardLink> links(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    links[i].task = i < num_ps ? TaskId{"ps", i} : o.cluster.coordinator();
    links[i].addr = o.cluster.address(links[i].task).value();
    // A tick may count at most two intervals of listening: a later one
    // means this process was busy, not that the shard was silent.
    links[i].silence = SilenceMeter(o.heartbeat_timeout, 2 * o.heartbeat_interval);
  }
  return links;
}

}  // namespace

Status Client::Impl::OpenContext(std::chrono::milliseconds handshake_timeout) {
  transport::ContextOptions topts;
  topts.backend = options_.transport;
  topts.name = options_.task.job + std::to_string(options_.task.index);
  topts.busy_poll = options_.busy_poll;
  // The caller waiting on a Future polls for its reply itself (WaitFor). A
  // progress thread polling too, without yielding, would hold the core the
  // caller needs whenever the two share one (pinned workers do).
  topts.spin_before_sleep = std::chrono::microseconds(0);
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(*ctx);
  transport::Context& ctx_ref = *ctx_;

  const int coordinator_index =
      options_.cluster.separate_coordinator() ? options_.cluster.num_tasks("ps") : 0;
  links_ =
      std::make_unique<client::ShardLinks>(ctx_ref, LinksOf(options_), coordinator_index, counts_);
  gpu_ = std::make_unique<client::GpuAccess>(options_.cuda_device,
                                             ctx_->CanRegister(transport::MemoryKind::kCuda),
                                             options_.allow_host_staging);
  client::ShardJoiner::Identity identity;
  identity.task_index = options_.read_only ? 0 : static_cast<uint32_t>(worker_rank_);
  if (options_.cuda_ipc && gpu::Available().ok()) identity.ipc_node_id = NodeId();
  joiner_ = std::make_unique<client::ShardJoiner>(*links_, ctx_ref, options_, std::move(identity),
                                                  handshake_timeout, tensors_, counts_);
  links_->SetReconnect([this](int shard) { joiner_->Reconnect(shard); });
  heartbeats_ =
      std::make_unique<client::Heartbeats>(*links_, ctx_ref, options_.task.ToString(),
                                           options_.heartbeat_interval, options_.heartbeat_timeout);
  fan_out_ = std::make_unique<client::FanOut>(ctx_ref, options_.op_timeout);
  if (options_.retry_lost_shard_within.count() > 0) {
    client::ShardLinks& links = *links_;
    fan_out_->SetRetry(std::make_unique<client::LostShardRetry>(
        ctx_ref, options_.retry_lost_shard_within, links.size(),
        client::LostShardRetry::Shards{.lost = [&links](int s) { return !links[s].dead.ok(); },
                                       .reconnect = [&links](int s) { links.Reconnect(s); },
                                       .name = [&links](int s) { return links[s].name(); }}));
    joiner_->SetOnBack([retry = fan_out_->retry()](int shard) { retry->ShardBack(shard); });
  }
  const uint64_t inline_bytes = std::min(options_.inline_bytes, wire::kMaxInlineBytes);
  sender_ = std::make_unique<client::PushSender>(*links_, *gpu_, counts_, ctx_ref, inline_bytes);
  receiver_ = std::make_unique<client::PullReceiver>(*links_, *gpu_, counts_, ctx_ref, inline_bytes,
                                                     options_.op_timeout);
  rows_ = std::make_unique<client::RowCalls>(id_, options_, ctx_ref, *links_, *fan_out_);
  ctx_->SetHandler(
      wire::kProtocolMsg,
      [links = links_.get()](const std::shared_ptr<transport::Endpoint>& ep,
                             std::span<const uint8_t> frame) { links->OnFrame(ep, frame); });
  ctx_->SetDisconnectHandler(
      [links = links_.get()](const std::shared_ptr<transport::Endpoint>& ep, const Status& why) {
        links->OnDisconnect(ep, why);
      });
  return Status::Ok();
}

}  // namespace tessera
