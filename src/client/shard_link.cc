// The client's links to its shards: connect, handshake, heartbeats, a lost
// shard reported and reconnected, its chunks re-created after a restart.

#include <algorithm>
#include <random>
#include <thread>

#include "client/client_impl.h"
#include "core/node_id.h"
#include "core/placement.h"
#include "core/secret.h"
#include "core/timeouts.h"

namespace tessera {

Client::Impl::~Impl() {
  // Control calls still queued fail now; the one running ends as its round
  // trips fail below, and is waited for before the context goes.
  control_.Shutdown(Status::Aborted("the client was destroyed before this call started"));
  coordinator_.Close();
  // A stream-ordered call whose stream reaches it from now on fails at once.
  if (poster_) poster_->Close();
  if (!ctx_) {
    control_.Join();
    return;
  }
  SayBye();
  std::promise<void> closed;
  ctx_->Post([this, &closed] {
    stopping_ = true;
    if (retry_) retry_->Stop();
    for (auto& s : shards_) {
      // One-sided operations still in flight are cancelled (Abort), so that
      // none writes into a caller's buffer after its call failed.
      if (s.ep && s.in_flight.ops.empty()) s.ep->Close();
      if (s.ep && !s.in_flight.ops.empty()) s.ep->Abort();
    }
    // Calls still running fail now, rather than leave their futures (which
    // may outlive the client, e.g. through the C API) waiting out the
    // operation timeout.
    for (size_t shard = 0; shard < shards_.size(); ++shard) {
      ShardConn& s = shards_[shard];
      if (s.dead.ok())
        s.dead = Status::Aborted("the client was destroyed before this call completed");
      FailCallsOf(static_cast<int>(shard), s.dead);
      if (retry_) retry_->FailHeld(static_cast<int>(shard), s.dead);
    }
    pending_.Clear();
    // Remote regions must go before the context.
    for (auto& s : shards_) {
      s.staging.reset();
      s.gather.Release();
      s.arenas.clear();
      UnmapShard(s);
    }
    closed.set_value();
  });
  closed.get_future().wait();
  control_.Join();
  if (driver_) driver_->Close();
  ctx_.reset();
}

void Client::Impl::SayBye() {
  // Bounded: a shard that does not answer is closed on anyway.
  constexpr auto kByeWait = std::chrono::seconds(2);
  auto answered = std::make_shared<std::promise<void>>();
  auto remaining = std::make_shared<size_t>(0);
  ctx_->Post([this, answered, remaining] {
    for (size_t s = 0; s < shards_.size(); ++s) {
      // Only to a shard this worker proved itself to: to any other a bye
      // is a protocol breach.
      if (!shards_[s].ep || !shards_[s].dead.ok() || !shards_[s].ep->authenticated()) continue;
      ++*remaining;
      Request(static_cast<int>(s), wire::Bye{}, 0,
              [answered, remaining](const Status&, const wire::Header&, std::span<const uint8_t>) {
                if (--*remaining == 0) answered->set_value();
              });
    }
    if (*remaining == 0) answered->set_value();
  });
  answered->get_future().wait_for(kByeWait);
}

void Client::Impl::OnFrame(const std::shared_ptr<transport::Endpoint>& ep,
                           std::span<const uint8_t> frame) {
  auto sit = shard_of_.find(ep.get());
  if (sit == shard_of_.end()) return;
  auto h = wire::DecodeHeader(frame);
  if (!h.ok()) {
    TLOG_WARN("bad message from {}: {}", shards_[sit->second].name(), h.status().ToString());
    return OnShardLost(sit->second, h.status().WithContext("bad message"));
  }
  ReplyFn fn;
  if (!pending_.Take(h->request_id, &fn)) {
    if (h->opcode == wire::Opcode::kPullReply) {
      // Nobody waits for it any more (the caller gave up): hand the lease back.
      auto reply = wire::DecodeBody<wire::PullReply>(*h, frame);
      if (reply.ok()) ep->Send(kProtocolMsg, wire::Encode(wire::Release{reply->lease_id}, 0));
      return;
    }
    if (h->opcode == wire::Opcode::kError) {
      auto err = wire::DecodeBody<wire::Error>(*h, frame);
      // A refusal the shard sent on accepting the connection, before it read
      // the hello (request 0), answers the handshake under way.
      ShardConn& conn = shards_[sit->second];
      if (h->request_id == 0 && conn.joining.request != 0 &&
          pending_.Take(conn.joining.request, &fn)) {
        return fn(err.ok() ? err->ToStatus() : err.status(), *h, frame);
      }
      TLOG_WARN("{}: {}", conn.name(), err.ok() ? err->message : "malformed error");
    }
    return;
  }
  if (h->opcode == wire::Opcode::kError) {
    auto err = wire::DecodeBody<wire::Error>(*h, frame);
    return fn(err.ok() ? err->ToStatus() : err.status(), *h, frame);
  }
  fn(Status::Ok(), *h, frame);
}

void Client::Impl::OnShardLost(int shard, const Status& why) {
  ShardConn& s = shards_[shard];
  if (!s.dead.ok()) return;
  if (shard == coord_index_) coordinator_.Note(false);
  s.dead = Status::Unavailable(s.name() + " is gone: " + why.message());
  if (!stopping_) TLOG_ERROR("{}", s.dead.message());
  // Forced: a hung peer would never let a graceful close finish, and the
  // abort fails the one-sided operations still in flight.
  if (s.ep) s.ep->Abort();
  FailCallsOf(shard, s.dead);
}

void Client::Impl::FailCallsOf(int shard, const Status& why) {
  ShardConn& s = shards_[shard];
  std::vector<ReplyFn> fail;
  pending_.TakeAllOf(shard, &fail);
  for (auto& fn : fail) fn(why, wire::Header{}, {});
  auto in_flight = std::move(s.in_flight.ops);
  s.in_flight.ops.clear();
  for (auto& [id, abort] : in_flight) abort(why);
  auto waiting = std::move(s.waiting_for_staging);
  for (auto& fn : waiting) fn();
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
  task_ = options_.task;
  auto rank = RankOf(options_);
  if (!rank.ok()) return rank.status();
  worker_rank_ = *rank;
  TESSERA_RETURN_IF_ERROR(CheckSecretStrength(options_.secret, options_.allow_weak_secret));
  TESSERA_RETURN_IF_ERROR(LogLevelFromEnv().status());
  TESSERA_RETURN_IF_ERROR(client::LostShardRetry::TakeBound(&options_));
  TESSERA_RETURN_IF_ERROR(TakeTimeouts(&options_, &handshake_timeout_));

  transport::ContextOptions topts;
  topts.backend = options_.transport;
  topts.name = task_.job + std::to_string(task_.index);
  topts.busy_poll = options_.busy_poll;
  // The caller waiting on a Future polls for its reply itself (WaitFor). A
  // progress thread polling too, without yielding, would hold the core the
  // caller needs whenever the two share one (pinned workers do).
  topts.spin_before_sleep = std::chrono::microseconds(0);
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  ctx_ = std::move(*ctx);
  fabric_gpu_ = ctx_->CanRegister(transport::MemoryKind::kCuda);
  if (options_.cuda_ipc && gpu::Available().ok()) ipc_node_id_ = NodeId();
  driver_ = std::make_shared<ProgressDriver>(ctx_.get());
  poster_ = std::make_shared<LoopPoster>(ctx_.get());
  ctx_->SetHandler(kProtocolMsg, [this](const std::shared_ptr<transport::Endpoint>& ep,
                                        std::span<const uint8_t> frame) { OnFrame(ep, frame); });
  ctx_->SetDisconnectHandler(
      [this](const std::shared_ptr<transport::Endpoint>& ep, const Status& why) {
        auto it = shard_of_.find(ep.get());
        if (it != shard_of_.end()) OnShardLost(it->second, why);
      });

  // Connections: one per ps task, then the coordinator if it runs separately
  // (else ps task 0 is the coordinator).
  const int num_ps = options_.cluster.num_tasks("ps");
  const bool separate_coordinator = options_.cluster.separate_coordinator();
  const int n = num_ps + (separate_coordinator ? 1 : 0);
  coord_index_ = separate_coordinator ? num_ps : 0;
  shards_.resize(static_cast<size_t>(n));
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) {
    shards_[i].task = i < num_ps ? TaskId{"ps", i} : options_.cluster.coordinator();
    shards_[i].addr = options_.cluster.address(shards_[i].task).value();
    // A tick may count at most two intervals of listening: a later one
    // means this process was busy, not that the shard was silent.
    shards_[i].silence = SilenceMeter(options_.heartbeat_timeout, 2 * options_.heartbeat_interval);
    names.push_back(shards_[i].name());
  }
  startup_ = std::make_unique<client::StartupWaiter>(std::move(names));
  if (options_.retry_lost_shard_within.count() > 0) {
    retry_ = std::make_unique<client::LostShardRetry>(
        *ctx_, options_.retry_lost_shard_within, shards_.size(),
        client::LostShardRetry::Shards{.lost = [this](int s) { return !shards_[s].dead.ok(); },
                                       .reconnect = [this](int s) { Reconnect(s); },
                                       .name = [this](int s) { return shards_[s].name(); }});
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.startup_timeout;
  ctx_->Post([this, n, deadline] {
    for (int i = 0; i < n; ++i) ConnectShard(i, deadline);
  });
  TESSERA_RETURN_IF_ERROR(startup_->Wait({.task = task_.ToString(),
                                          .deadline = deadline,
                                          .startup_timeout = options_.startup_timeout,
                                          .report_interval = options_.report_interval,
                                          .interrupted = options_.interrupted}));
  if (options_.heartbeat_timeout.count() > 0) {
    ctx_->Post([this] {
      for (auto& conn : shards_) conn.silence.Reset(std::chrono::steady_clock::now());
      ctx_->PostAfter(options_.heartbeat_interval, [this] { Heartbeat(); });
    });
  }
  TLOG_INFO("{} connected to {} ps task(s){} over {}", task_.ToString(), num_ps,
            separate_coordinator ? " and the coordinator" : "", ctx_->Describe());
  return Status::Ok();
}

void Client::Impl::Heartbeat() {
  if (stopping_) return;
  // The event loop polled the fabric until idle before running this timer,
  // so whatever the shards sent meanwhile has been seen.
  const auto now = std::chrono::steady_clock::now();
  const auto late = now - next_heartbeat_;
  if (next_heartbeat_.time_since_epoch().count() != 0 && late > options_.heartbeat_timeout) {
    // Worth knowing (it explains slow calls), and not held against the
    // shards: the silence meters count at most two intervals for it.
    TLOG_WARN("{}: this worker's progress loop was held up for {} ms; heartbeats resume",
              task_.ToString(),
              std::chrono::duration_cast<std::chrono::milliseconds>(late).count());
  }
  next_heartbeat_ = now + options_.heartbeat_interval;
  for (int i = 0; i < static_cast<int>(shards_.size()); ++i) {
    ShardConn& s = shards_[i];
    if (!s.dead.ok()) {
      Reconnect(i);
      continue;
    }
    if (!s.ep) continue;
    if (s.silence.Tick(now, s.ep->last_traffic())) {
      OnShardLost(
          i, Status::DeadlineExceeded("no answer to heartbeats and no traffic at all for " +
                                      std::to_string(s.silence.silent().count()) +
                                      " ms of listening (heartbeat timeout " +
                                      std::to_string(options_.heartbeat_timeout.count()) + " ms)"));
      continue;
    }
    Request(i, wire::Ping{}, 0,
            [](const Status&, const wire::Header&, std::span<const uint8_t>) {});
  }
  ctx_->PostAfter(options_.heartbeat_interval, [this] { Heartbeat(); });
}

namespace {

// 300 ms, doubling to 5 s, each drawn from its upper half: a worker turned
// away during a flood of strangers comes back soon, and workers turned
// away together do not all come back at once.
std::chrono::milliseconds HandshakeBackoff(int attempt) {
  const int64_t cap = std::min<int64_t>(5000, int64_t{300} << std::min(attempt, 5));
  static thread_local std::minstd_rand rng(std::random_device{}());
  return std::chrono::milliseconds(cap / 2 + static_cast<int64_t>(rng() % (cap / 2 + 1)));
}

}  // namespace

void Client::Impl::ConnectShard(int shard, std::chrono::steady_clock::time_point deadline) {
  if (stopping_) return;
  ShardConn& s = shards_[shard];
  auto attempt = std::chrono::milliseconds(2000);
  ctx_->Connect(s.addr.host, s.addr.port, attempt,
                [this, shard, deadline](Result<std::shared_ptr<transport::Endpoint>> ep) {
                  // A connect the closing context cancels: ctx_ is going.
                  if (stopping_) return;
                  if (!ep.ok()) {
                    // A listener that answers, but not as Tessera's tcp does
                    // (FailedPrecondition), will not start to: fail at once.
                    // Nothing listening, or a name that does not resolve yet
                    // (a Kubernetes pod not yet running), is waited for.
                    const bool never = ep.status().code() == StatusCode::kFailedPrecondition;
                    if (never) {
                      startup_->Failed(shard, ep.status());
                    } else {
                      startup_->Retrying(shard, ep.status().message());
                    }
                    if (!never && std::chrono::steady_clock::now() < deadline) {
                      ctx_->PostAfter(std::chrono::milliseconds(300),
                                      [this, shard, deadline] { ConnectShard(shard, deadline); });
                    }
                    return;
                  }
                  ShardConn& conn = shards_[shard];
                  conn.ep = *ep;
                  conn.dead = Status::Ok();
                  shard_of_[conn.ep.get()] = shard;
                  Handshake(shard, [this, shard, deadline](const Status& st) {
                    OnStartHandshake(shard, deadline, st);
                  });
                });
}

void Client::Impl::OnStartHandshake(int shard, std::chrono::steady_clock::time_point deadline,
                                    const Status& st) {
  ShardConn& c = shards_[shard];
  // No answer (the shard may never have seen this connection), turned
  // away for now (too many strangers waiting, or failed guesses from
  // outside the cluster), or cut off mid-handshake (pushed out of the
  // shard's table by a flood, without a reason): a new connection after a
  // while, growing, until the deadline. A wrong secret is not retried.
  const bool again = st.code() == StatusCode::kDeadlineExceeded ||
                     st.code() == StatusCode::kResourceExhausted ||
                     st.code() == StatusCode::kUnavailable;
  if (again && std::chrono::steady_clock::now() < deadline) {
    shard_of_.erase(c.ep.get());
    c.ep->Abort();
    c.ep.reset();
    startup_->Retrying(shard, st.message());
    const auto pause = HandshakeBackoff(c.joining.attempts++);
    TLOG_WARN("{} {}; connecting again in {} ms", c.name(), st.message(), pause.count());
    ctx_->PostAfter(pause, [this, shard, deadline] { ConnectShard(shard, deadline); });
    return;
  }
  c.joining.attempts = 0;
  if (!st.ok()) {
    startup_->Failed(shard, st);
    return OnShardLost(shard, st);
  }
  startup_->Welcomed(shard);
  if (shard == coord_index_) coordinator_.Note(true);
}

void Client::Impl::Reconnect(int shard) {
  ShardConn& s = shards_[shard];
  const auto now = std::chrono::steady_clock::now();
  if (stopping_ || s.joining.reconnecting || s.dead.ok() || now < s.joining.next_reconnect) {
    return;
  }
  s.joining.next_reconnect = now + std::chrono::seconds(1);
  s.joining.reconnecting = true;
  ctx_->Connect(s.addr.host, s.addr.port, std::chrono::milliseconds(2000),
                [this, shard](Result<std::shared_ptr<transport::Endpoint>> ep) {
                  ShardConn& conn = shards_[shard];
                  if (!ep.ok() || stopping_) {
                    conn.joining.reconnecting = false;
                    return;
                  }
                  // The old connection's regions go with it.
                  conn.staging.reset();
                  conn.arenas.clear();
                  UnmapShard(conn);
                  if (conn.ep) shard_of_.erase(conn.ep.get());
                  conn.ep = *ep;
                  shard_of_[conn.ep.get()] = shard;
                  conn.silence.Reset(std::chrono::steady_clock::now());
                  Handshake(shard, [this, shard](const Status& st) {
                    if (!st.ok()) {
                      if (st.code() == StatusCode::kDeadlineExceeded) {
                        TLOG_WARN("{} {}; trying again", shards_[shard].name(), st.message());
                      } else {
                        TLOG_WARN("{} answers again but refused this worker: {}",
                                  shards_[shard].name(), st.message());
                      }
                      shards_[shard].joining.reconnecting = false;
                      if (shards_[shard].ep) shards_[shard].ep->Abort();
                      return;
                    }
                    ReCreate(shard);
                  });
                });
}

void Client::Impl::ReCreate(int shard) {
  wire::Create create;
  std::vector<Chunk*> chunks;
  {
    auto lock = tensors_.Lock();
    for (auto& e : tensors_.EntriesLocked()) {
      for (uint32_t c = 0; c < e.chunks.size(); ++c) {
        Chunk& chunk = e.chunks[c];
        if (chunk.shard != shard) continue;
        wire::CreateEntry ce;
        ce.tensor = e.decl;
        ce.chunk_index = c;
        ce.num_chunks = static_cast<uint32_t>(e.chunks.size());
        ce.elem_offset = chunk.elem_offset;
        ce.elem_count = chunk.elem_count;
        create.entries.push_back(std::move(ce));
        chunks.push_back(&chunk);
      }
    }
  }
  auto finish = [this, shard](const Status& st) {
    ShardConn& conn = shards_[shard];
    conn.joining.reconnecting = false;
    if (!st.ok()) {
      TLOG_WARN("{}: re-creating this worker's tensors failed: {}", conn.name(), st.message());
      if (conn.ep) conn.ep->Abort();
      return;
    }
    conn.dead = Status::Ok();
    if (shard == coord_index_) coordinator_.Note(true);
    TLOG_INFO("{} is back{}", conn.name(),
              conn.task.job == "ps" ? "; this worker's tensors on it were created again" : "");
    if (retry_) retry_->ShardBack(shard);
  };
  if (create.entries.empty()) return finish(Status::Ok());
  Request(shard, create, 0,
          [this, shard, chunks, finish](const Status& st, const wire::Header& h,
                                        std::span<const uint8_t> frame) {
            if (!st.ok()) return finish(st);
            auto reply = wire::DecodeBody<wire::CreateReply>(h, frame);
            if (!reply.ok()) return finish(reply.status());
            if (reply->keys.size() != chunks.size())
              return finish(Status::Internal("create reply does not match the request"));
            ShardConn& conn = shards_[shard];
            for (const auto& a : reply->arenas) {
              auto r = conn.ep->Attach(a.region);
              if (!r.ok()) return finish(r.status());
              conn.arenas[a.arena_id] = std::move(*r);
              MapArena(conn, a);
            }
            for (size_t k = 0; k < chunks.size(); ++k) {
              if (reply->keys[k].byte_length != chunks[k]->bytes)
                return finish(Status::Internal("shard holds a chunk of another size"));
              chunks[k]->key_id = reply->keys[k].key_id;
              chunks[k]->arena_id = reply->keys[k].arena_id;
              chunks[k]->arena_offset = reply->keys[k].arena_offset;
            }
            finish(Status::Ok());
          });
}

void Client::Impl::Handshake(int shard, std::function<void(Status)> done) {
  // `done` is called once: with the error, or OK when welcomed, or when the
  // shard let the hello deadline pass without either. A reply that never
  // comes (a connection the far side dropped unseen) must not hold this
  // worker's start, or its reconnect, for ever: after the deadline the
  // caller connects again.
  struct Turn {
    std::function<void(Status)> done;
    uint64_t request = 0;  // the request waiting for its answer
  };
  auto turn = std::make_shared<Turn>(Turn{std::move(done), 0});
  auto fail = [this, shard, turn](const Status& st) {
    if (!turn->done) return;
    shards_[shard].joining.request = 0;
    auto call = std::move(turn->done);
    turn->done = nullptr;
    call(st);
  };
  wire::Hello hello;
  hello.role = options_.read_only ? wire::PeerRole::kReader : wire::PeerRole::kWorker;
  hello.task_index = options_.read_only ? 0 : static_cast<uint32_t>(worker_rank_);
  hello.task = task_.ToString();
  hello.node_id = ipc_node_id_;
  hello.cluster = options_.cluster.ToJson();
  hello.protection = options_.session_protection;
  auto handshake = std::make_shared<wire::ClientHandshake>(options_.secret, std::move(hello));
  const ShardConn& conn = shards_[shard];
  const uint32_t expect_index = shard == coord_index_ && conn.task.job == "coordinator"
                                    ? wire::kCoordinatorIndex
                                    : static_cast<uint32_t>(shard);
  // The hello's answer is a challenge, the auth's a welcome: each read by
  // the handshake itself (ClientHandshake::OnFrame).
  auto read =
      [handshake, expect_index, name = conn.name()](
          const Status& st,
          std::span<const uint8_t> frame) -> Result<std::variant<wire::Auth, wire::Welcome>> {
    if (!st.ok()) return st;
    return handshake->OnFrame(frame, expect_index, name);
  };
  ctx_->PostAfter(handshake_timeout_, [this, turn, fail] {
    if (stopping_ || !turn->done) return;
    pending_.Erase(turn->request);
    fail(Status::DeadlineExceeded("took the connection but did not finish the handshake within " +
                                  std::to_string(handshake_timeout_.count()) + " ms"));
  });
  shards_[shard].joining.request = turn->request =
      Request(shard, handshake->hello(), 0,
              [this, shard, read, fail, turn, handshake](const Status& st, const wire::Header&,
                                                         std::span<const uint8_t> frame) {
                auto auth = read(st, frame);
                if (!auth.ok()) return fail(auth.status());
                if (!std::holds_alternative<wire::Auth>(*auth)) {
                  return fail(Status::Internal("a welcome before the challenge"));
                }
                shards_[shard].joining.request = turn->request = Request(
                    shard, std::get<wire::Auth>(*auth), 0,
                    [this, shard, read, fail, handshake](const Status& st2, const wire::Header&,
                                                         std::span<const uint8_t> f2) {
                      auto welcomed = read(st2, f2);
                      if (!welcomed.ok()) return fail(welcomed.status());
                      if (!std::holds_alternative<wire::Welcome>(*welcomed)) {
                        return fail(Status::Internal("a second challenge"));
                      }
                      fail(AcceptWelcome(shard, std::get<wire::Welcome>(*welcomed), *handshake));
                    });
              });
}

Status Client::Impl::AcceptWelcome(int shard, const wire::Welcome& w,
                                   const wire::ClientHandshake& handshake) {
  ShardConn& s = shards_[shard];
  s.ep->MarkAuthenticated();
  if (w.session_protected()) {
    // Before anything else is sent: the shard seals all after its welcome.
    TESSERA_RETURN_IF_ERROR(s.ep->ProtectSession(handshake.Keys()));
    counts_.protected_sessions++;
  }
  // The coordinator has no staging slot, nor has a reader one.
  if (s.task.job != "ps" || options_.read_only) return Status::Ok();
  auto staging = s.ep->Attach(w.staging_region);
  if (!staging.ok()) return staging.status();
  if (AlignUp(options_.chunk_bytes, 64) > (*staging)->size()) {
    return Status::InvalidArgument(
        "chunk_bytes " + std::to_string(options_.chunk_bytes) + " exceeds the " +
        std::to_string((*staging)->size()) + "-byte staging slot of " + s.name() +
        "; lower chunk_bytes or start the shard with a larger --staging-mib");
  }
  s.alloc.Reset((*staging)->size());
  s.staging = std::move(*staging);
  if (w.staging_ipc.empty()) return Status::Ok();
  auto slot =
      gpu::IpcMapping::Open(w.staging_ipc.data(), w.staging_ipc.size(), options_.cuda_device);
  if (slot.ok()) {
    s.ipc.slot = std::move(*slot);
    counts_.ipc_shards++;
    TLOG_INFO("{} shares this node: reached through CUDA IPC", s.name());
  } else {
    TLOG_WARN("{} offered CUDA IPC, which failed ({}): using the fabric", s.name(),
              slot.status().message());
  }
  return Status::Ok();
}

}  // namespace tessera
