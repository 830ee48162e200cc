// A server process composes its roles (server/role.h): it owns the
// transport's context, the listener, the peers' sessions and the router,
// plus the coordinator where this task hosts it and the shard where it
// holds tensors. A coordinator-only task builds no shard.
#include <nlohmann/json.hpp>

#include "core/heap_counter.h"
#include "core/log.h"
#include "server/hosted_coordinator.h"
#include "server/router.h"
#include "server/shard.h"

namespace tessera {
namespace {

using server::Role;

std::string DescribeSessionProtection(SessionProtection protection, bool can) {
  if (!can) return "sessions unprotected: this fabric cannot protect them (docs/security.md)";
  switch (protection) {
    case SessionProtection::kOn:
      return "every session authenticated and encrypted after its handshake "
             "(session protection on)";
    case SessionProtection::kOff:
      return "sessions unprotected (session protection off)";
    case SessionProtection::kIntegrity:
      return "every session authenticated, not encrypted, after its handshake "
             "(session protection integrity)";
    default:
      return "sessions that leave the host authenticated and encrypted, loopback ones not "
             "(session protection auto)";
  }
}

// What the options say that no role can work with, before anything opens.
Status CheckOptions(const ServerOptions& o) {
  TESSERA_RETURN_IF_ERROR(o.cluster.Validate());
  if (o.job != "ps" && o.job != "coordinator") {
    return Status::InvalidArgument("a server runs a ps or coordinator task, not '" + o.job + "'");
  }
  TESSERA_RETURN_IF_ERROR(o.cluster.address(TaskId{o.job, o.task_index}).status());
  TESSERA_RETURN_IF_ERROR(CheckSecretStrength(o.secret, o.allow_weak_secret));
  if (IsReaderKey(o.secret)) {
    return Status::InvalidArgument(
        "the secret given is a reader key, which lets read-only clients in; a " + o.job +
        " task needs the cluster secret it was derived from");
  }
  return LogLevelFromEnv().status();
}

}  // namespace

class Server::Impl {
 public:
  explicit Impl(const ServerOptions& options)
      : options_(options), role_(server::RoleOf(options_)) {}
  ~Impl() { Stop(); }
  Status Start();
  void Stop();
  uint16_t port() const { return listener_ ? listener_->port() : 0; }
  ServerStats stats() const;
  std::optional<Status> WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit);
  bool WaitForCoordinatorToStop(std::chrono::milliseconds limit) {
    return HostsCoordinator(role_) || end_.WaitForCoordinatorStop(limit);
  }

 private:
  Status OpenContext();
  Status OpenSessions();
  // The coordinator hosted here: what it is lent of this server.
  Status OpenCoordinator(const ckpt::CheckpointKey& key);
  Status Listen();
  // Serves: the roles' first work on the progress thread.
  void Begin();
  // A clean stop: each ps task's link (to the coordinator here), and this
  // task's link (to the coordinator elsewhere), told and briefly awaited.
  void SayBye();
  // What `tessera status` shows of this task, as JSON.
  std::string StatusJson() const;
  TaskId self() const { return {options_.job, options_.task_index}; }

  const ServerOptions options_;
  const Role role_;
  // The verdict on the workers, for WaitUntilWorkersLeave, and the
  // coordinator's stop (any thread).
  server::EndSignals end_;
  std::unique_ptr<transport::Context> ctx_;
  // Progress thread only, from here on.
  std::unique_ptr<server::PeerSessions> sessions_;
  server::WorkerRoster roster_{options_.worker_rejoin_grace};
  std::optional<server::WorkersLeaving> leaving_;  // stop_when_workers_leave only
  server::ByeRound bye_;
  // Declared before the shard: the shard that reaches it goes first.
  std::unique_ptr<server::HostedCoordinator> coordinator_;
  std::unique_ptr<server::Shard> shard_;
  std::unique_ptr<server::Router> router_;
  std::unique_ptr<transport::Listener> listener_;
};

Status Server::Impl::Start() {
  TESSERA_RETURN_IF_ERROR(CheckOptions(options_));
  auto checkpoint_key = ckpt::CheckpointKeyFor(options_.secret);
  if (!checkpoint_key.ok()) return checkpoint_key.status();
  TESSERA_RETURN_IF_ERROR(OpenContext());
  TESSERA_RETURN_IF_ERROR(OpenSessions());
  if (HostsCoordinator(role_)) {
    coordinator_ = std::make_unique<server::HostedCoordinator>(options_, role_);
  }
  if (HoldsTensors(role_)) {
    shard_ = std::make_unique<server::Shard>(options_,
                                             server::Shard::Lent{.ctx = ctx_.get(),
                                                                 .sessions = sessions_.get(),
                                                                 .roster = &roster_,
                                                                 .bye = &bye_,
                                                                 .checkpoint_key = *checkpoint_key,
                                                                 .hosted = coordinator_.get(),
                                                                 .coordinator_stopped = [this] {
                                                                   end_.NoteCoordinatorStopped();
                                                                   if (leaving_) leaving_->Check();
                                                                 }});
    TESSERA_RETURN_IF_ERROR(shard_->Open());
  }
  if (options_.stop_when_workers_leave) {
    // Off the coordinator, the end waits for the coordinator's: its final
    // checkpoint needs this task serving.
    leaving_.emplace(*ctx_, end_,
                     server::WorkersLeaving::Options{.num_workers = options_.cluster.num_workers(),
                                                     .grace = options_.workers_grace,
                                                     .coordinator_gone = [this] {
                                                       return HostsCoordinator(role_) ||
                                                              shard_->coordinator_gone();
                                                     }});
  }
  if (coordinator_) TESSERA_RETURN_IF_ERROR(OpenCoordinator(*checkpoint_key));
  router_ = std::make_unique<server::Router>(
      server::Router::Parts{.sessions = sessions_.get(),
                            .coordinator = coordinator_.get(),
                            .shard = shard_.get(),
                            .bye = &bye_,
                            .roster = &roster_,
                            .leaving = leaving_ ? &*leaving_ : nullptr,
                            .status_json = [this] { return StatusJson(); }});
  ctx_->SetHandler(wire::kProtocolMsg,
                   [this](const server::EndpointPtr& ep, std::span<const uint8_t> frame) {
                     router_->OnMessage(ep, frame);
                   });
  ctx_->SetDisconnectHandler(
      [this](const server::EndpointPtr& ep, const Status& why) { router_->OnDisconnect(ep, why); });
  TESSERA_RETURN_IF_ERROR(Listen());
  Begin();
  return Status::Ok();
}

Status Server::Impl::OpenContext() {
  transport::ContextOptions topts;
  topts.backend = options_.transport;
  topts.name = options_.job + std::to_string(options_.task_index);
  topts.busy_poll = options_.busy_poll;
  topts.spin_before_sleep = options_.spin_before_sleep;
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(*ctx);
  if (options_.session_protection == SessionProtection::kOn && !ctx_->CanProtectSessions()) {
    return Status::FailedPrecondition(
        "session protection on needs --transport tcp: " + ctx_->Describe() +
        " cannot authenticate or encrypt sessions (docs/security.md)");
  }
  return Status::Ok();
}

Status Server::Impl::OpenSessions() {
  server::PeerSessions::Options o{.server = &options_,
                                  .reader_key = ReaderKey(options_.secret),
                                  .hello_index = role_ == Role::kCoordinator
                                                     ? wire::kCoordinatorIndex
                                                     : static_cast<uint32_t>(options_.task_index),
                                  .hosts_coordinator = HostsCoordinator(role_)};
  // The router exists before the first connection is accepted.
  server::PeerSessions::Events events{
      .worker_joins = [this](
                          server::Peer& peer,
                          wire::Welcome* welcome) { return router_->OnWorkerJoins(peer, welcome); },
      .ended = [this](const server::EndpointPtr& ep,
                      const Status& why) { router_->OnDisconnect(ep, why); }};
  sessions_ = std::make_unique<server::PeerSessions>(*ctx_, std::move(o), std::move(events));
  return sessions_->Open();
}

Status Server::Impl::OpenCoordinator(const ckpt::CheckpointKey& key) {
  server::CoordinatorHost::Hooks hooks;
  hooks.ctx = ctx_.get();
  hooks.checkpoint_key = key;
  hooks.send_to_peer = [this](server::CoordinatorHost::PeerId peer, MessageBytes frame) {
    // A peer that left meanwhile (a worker waiting for a round) is skipped.
    server::Peer* to = sessions_->Find(reinterpret_cast<transport::Endpoint*>(peer));
    if (to != nullptr) to->ep->Send(wire::kProtocolMsg, std::move(frame));
  };
  if (shard_) {
    hooks.to_local_shard = [this](MessageBytes frame) { shard_->OnCheckpointFrame(frame); };
  }
  return coordinator_->Open(std::move(hooks));
}

Status Server::Impl::Listen() {
  const TaskAddress addr = options_.cluster.address(self()).value();  // CheckOptions
  const std::string host = options_.bind_host.empty() ? addr.host : options_.bind_host;
  const uint16_t port = options_.bind_port != 0 ? options_.bind_port : addr.port;
  auto listener =
      ctx_->Listen(host, port, [this](const server::EndpointPtr& ep) { sessions_->Accept(ep); });
  if (!listener.ok()) return listener.status().WithContext(self().ToString());
  listener_ = std::move(*listener);
  TLOG_INFO("{} serving on {}:{} over {}{}; {}", self().ToString(), host, listener_->port(),
            ctx_->Describe(),
            !shard_        ? " (the coordinator, holding no parameters)"
            : coordinator_ ? " (and the coordinator); parameters in " + shard_->DescribeMemory()
                           : "; parameters in " + shard_->DescribeMemory(),
            DescribeSessionProtection(options_.session_protection, ctx_->CanProtectSessions()));
  return Status::Ok();
}

void Server::Impl::Begin() {
  if (shard_) shard_->Begin();
  if (coordinator_) {
    ctx_->Post([this] {
      if (!shard_) return coordinator_->Start(nullptr);
      coordinator_->Start([this](const wire::JoinReply& reply) { shard_->OnHostedJoined(reply); });
    });
  }
  // A job whose workers never come ends too, after the grace time.
  if (leaving_) ctx_->Post([this] { leaving_->Check(); });
}

void Server::Impl::SayBye() {
  constexpr auto kByeWait = std::chrono::seconds(2);
  auto answered = std::make_shared<std::promise<void>>();
  ctx_->Post([this, answered] {
    bye_.Begin(answered);
    if (shard_) shard_->SayByeToCoordinator();
    const auto bye = wire::Encode(wire::Bye{}, server::ByeRound::kRequestId);
    if (sessions_) {  // none where the start failed before them
      sessions_->ForEach([&](server::Peer& peer) {
        if (!peer.is_shard) return;
        peer.ep->Send(wire::kProtocolMsg, bye);
        bye_.Await(peer.ep.get());
      });
    }
    bye_.AllSent();
  });
  // The bound is for a peer that hangs: one that stopped (its connection
  // ended, maybe with the bye unread) counts as answered at once.
  answered->get_future().wait_for(kByeWait);
}

void Server::Impl::Stop() {
  // Whoever waits for the workers to leave hears of the stop instead.
  end_.Decide(Status::Aborted("the server was stopped"));
  if (!ctx_) return;
  if (coordinator_ && !options_.checkpoint_dir.empty()) {
    // The final checkpoint, while the other shards still serve (`tessera
    // launch` stops the coordinator first).
    auto done = std::make_shared<std::promise<void>>();
    ctx_->Post([this, done] { coordinator_->SaveFinal([done] { done->set_value(); }); });
    done->get_future().wait_for(options_.checkpoint_timeout + std::chrono::seconds(5));
  }
  if (router_) SayBye();
  listener_.reset();
  // Peers' staging slots are freed only after the progress thread stopped:
  // over tcp a put arriving late is written by that thread.
  std::unordered_map<transport::Endpoint*, std::unique_ptr<server::Peer>> peers;  // freed last
  std::promise<void> done;
  ctx_->Post([this, &done, &peers] {
    if (leaving_) leaving_->Stop();
    // On this thread: its checkpointer's callbacks run here. The service
    // itself stays until the server goes: stats() may read it meanwhile.
    if (coordinator_) coordinator_->Stop();
    if (shard_) shard_->StopServing();
    if (sessions_) peers = sessions_->CloseAll();
    done.set_value();
  });
  done.get_future().wait();
  if (shard_) shard_->JoinWriter();
  ctx_.reset();  // stops progress: nothing writes into the arenas any more
  if (shard_) shard_->Release();
}

std::optional<Status> Server::Impl::WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit) {
  if (!options_.stop_when_workers_leave) {
    return Status::FailedPrecondition("the server was not started to stop when workers leave");
  }
  return end_.WaitForVerdict(limit);
}

ServerStats Server::Impl::stats() const {
  ServerStats s;
  if (shard_) shard_->AddStats(&s);
  if (coordinator_) coordinator_->AddStats(&s);
  s.connections_refused = sessions_ ? sessions_->refused() : 0;
  s.step_messages_from_workers = router_ ? router_->step_messages_from_workers() : 0;
  s.worker_departures = roster_.departures();
  return s;
}

std::string Server::Impl::StatusJson() const {
  const ServerStats s = stats();
  nlohmann::json workers = nlohmann::json::array();
  nlohmann::json readers = nlohmann::json::array();
  sessions_->ForEach([&](const server::Peer& peer) {
    if (!peer.authenticated || peer.is_shard || peer.is_observer) return;
    if (peer.is_reader) {
      readers.push_back({{"task", peer.hello.task}, {"address", peer.ep->peer()}});
      return;
    }
    workers.push_back({{"task", peer.hello.task},
                       {"address", peer.ep->peer()},
                       {"cuda_ipc", peer.ipc_slot != nullptr}});
  });
  nlohmann::json roles = nlohmann::json::array();
  if (shard_) roles.push_back("shard");
  if (coordinator_) roles.push_back("coordinator");
  nlohmann::json j = {{"task", self().ToString()},
                      {"roles", roles},
                      {"coordinator", coordinator_ != nullptr},
                      {"transport", ctx_->Describe()},
                      {"workers", workers},
                      {"readers", readers},
                      {"stats",
                       {{"tensors", s.tensors},
                        {"pushes_applied", s.pushes_applied},
                        {"pulls_served", s.pulls_served},
                        {"connections_refused", s.connections_refused},
                        {"leases_revoked", s.leases_revoked},
                        {"sync_steps_applied", s.sync_steps_applied},
                        {"stale_pushes_dropped", s.stale_pushes_dropped},
                        {"duplicate_pushes_dropped", s.duplicate_pushes_dropped},
                        {"chunks_restored", s.chunks_restored},
                        {"checkpoints_written", s.checkpoints_written},
                        {"host_staged_bytes", s.host_staged_bytes},
                        {"cuda_ipc_workers", s.cuda_ipc_workers},
                        {"worker_departures", s.worker_departures}}}};
  if (shard_) shard_->AddStatus(&j);
  // Only where the process counts them (the `tessera` tool does): the
  // bench's figure of the shard's allocations per call.
  if (const auto allocations = HeapAllocationsSoFar()) j["heap_allocations"] = *allocations;
  if (coordinator_) {
    j["global_step"] = coordinator_->global_step();
    // What the coordinator was told of steps, and by whom: the shards count
    // them, at most one report per ps task per sync step; workers say none.
    j["step_reports"] = {{"from_ps_tasks", s.step_reports_from_ps},
                         {"from_workers", s.step_messages_from_workers}};
  }
  return j.dump();
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
uint16_t Server::port() const { return impl_->port(); }
ServerStats Server::stats() const { return impl_->stats(); }
void Server::Stop() { impl_->Stop(); }
Status Server::WaitUntilWorkersLeave() {
  for (;;) {
    if (auto verdict = impl_->WaitUntilWorkersLeaveFor(std::chrono::hours(1))) return *verdict;
  }
}
std::optional<Status> Server::WaitUntilWorkersLeaveFor(std::chrono::milliseconds limit) {
  return impl_->WaitUntilWorkersLeaveFor(limit);
}
bool Server::WaitForCoordinatorToStop(std::chrono::milliseconds limit) {
  return impl_->WaitForCoordinatorToStop(limit);
}

}  // namespace tessera
