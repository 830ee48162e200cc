// Joining shards: connect, handshake, welcome; at the start and after a
// shard was lost, when this worker's chunks are created on it again.

#include "client/shard_joiner.h"

#include <algorithm>
#include <random>

#include "core/bytes.h"
#include "core/log.h"

namespace tessera::client {
namespace {

// 300 ms, doubling to 5 s, each drawn from its upper half: a worker turned
// away during a flood of strangers comes back soon, and workers turned
// away together do not all come back at once.
std::chrono::milliseconds HandshakeBackoff(int attempt) {
  const int64_t cap = std::min<int64_t>(5000, int64_t{300} << std::min(attempt, 5));
  static thread_local std::minstd_rand rng(std::random_device{}());
  return std::chrono::milliseconds(cap / 2 + static_cast<int64_t>(rng() % (cap / 2 + 1)));
}

constexpr auto kConnectAttempt = std::chrono::milliseconds(2000);

}  // namespace

ShardJoiner::ShardJoiner(ShardLinks& links, transport::Context& ctx, const ClientOptions& options,
                         Identity identity, std::chrono::milliseconds handshake_timeout,
                         TensorTable& tensors, CallCounters& counts)
    : links_(links),
      ctx_(ctx),
      options_(options),
      identity_(std::move(identity)),
      handshake_timeout_(handshake_timeout),
      tensors_(tensors),
      counts_(counts) {}

Status ShardJoiner::JoinAll(const StartupWaiter::Options& waiting) {
  const int n = static_cast<int>(links_.size());
  std::vector<std::string> names;
  names.reserve(links_.size());
  for (int i = 0; i < n; ++i) names.push_back(links_[i].name());
  startup_ = std::make_unique<StartupWaiter>(std::move(names));
  ctx_.Post([this, n, deadline = waiting.deadline] {
    for (int i = 0; i < n; ++i) Connect(i, deadline);
  });
  return startup_->Wait(waiting);
}

void ShardJoiner::Connect(int shard, Deadline deadline) {
  if (links_.stopping()) return;
  const ShardLink& s = links_[shard];
  ctx_.Connect(s.addr.host, s.addr.port, kConnectAttempt,
               [this, shard, deadline](Result<std::shared_ptr<transport::Endpoint>> ep) {
                 // A connect the closing context cancels: the context is going.
                 if (links_.stopping()) return;
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
                     ctx_.PostAfter(std::chrono::milliseconds(300),
                                    [this, shard, deadline] { Connect(shard, deadline); });
                   }
                   return;
                 }
                 links_.Bind(shard, std::move(*ep));
                 links_[shard].dead = Status::Ok();
                 Handshake(shard, [this, shard, deadline](const Status& st) {
                   OnStartHandshake(shard, deadline, st);
                 });
               });
}

void ShardJoiner::OnStartHandshake(int shard, Deadline deadline, const Status& st) {
  ShardLink& c = links_[shard];
  // No answer (the shard may never have seen this connection), turned
  // away for now (too many strangers waiting, or failed guesses from
  // outside the cluster), or cut off mid-handshake (pushed out of the
  // shard's table by a flood, without a reason): a new connection after a
  // while, growing, until the deadline. A wrong secret is not retried.
  const bool again = st.code() == StatusCode::kDeadlineExceeded ||
                     st.code() == StatusCode::kResourceExhausted ||
                     st.code() == StatusCode::kUnavailable;
  if (again && std::chrono::steady_clock::now() < deadline) {
    links_.Unbind(shard);
    startup_->Retrying(shard, st.message());
    const auto pause = HandshakeBackoff(c.joining.attempts++);
    TLOG_WARN("{} {}; connecting again in {} ms", c.name(), st.message(), pause.count());
    ctx_.PostAfter(pause, [this, shard, deadline] { Connect(shard, deadline); });
    return;
  }
  c.joining.attempts = 0;
  if (!st.ok()) {
    startup_->Failed(shard, st);
    return links_.Lost(shard, st);
  }
  startup_->Welcomed(shard);
  if (shard == links_.coordinator_index()) links_.coordinator().Note(true);
}

void ShardJoiner::Reconnect(int shard) {
  ShardLink& s = links_[shard];
  const auto now = std::chrono::steady_clock::now();
  if (links_.stopping() || s.joining.reconnecting || s.dead.ok() ||
      now < s.joining.next_reconnect) {
    return;
  }
  s.joining.next_reconnect = now + std::chrono::seconds(1);
  s.joining.reconnecting = true;
  ctx_.Connect(s.addr.host, s.addr.port, kConnectAttempt,
               [this, shard](Result<std::shared_ptr<transport::Endpoint>> ep) {
                 if (!ep.ok() || links_.stopping()) {
                   links_[shard].joining.reconnecting = false;
                   return;
                 }
                 OnReconnected(shard, std::move(*ep));
               });
}

void ShardJoiner::OnReconnected(int shard, std::shared_ptr<transport::Endpoint> ep) {
  ShardLink& link = links_[shard];
  // The old connection's regions go with it.
  link.DropRegions(counts_);
  links_.Bind(shard, std::move(ep));
  link.silence.Reset(std::chrono::steady_clock::now());
  Handshake(shard, [this, shard](const Status& st) {
    ShardLink& s = links_[shard];
    if (st.ok()) return ReCreate(shard);
    if (st.code() == StatusCode::kDeadlineExceeded) {
      TLOG_WARN("{} {}; trying again", s.name(), st.message());
    } else {
      TLOG_WARN("{} answers again but refused this worker: {}", s.name(), st.message());
    }
    s.joining.reconnecting = false;
    if (s.ep) s.ep->Abort();
  });
}

void ShardJoiner::ReCreate(int shard) {
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
  if (create.entries.empty()) return OnReCreated(shard, Status::Ok());
  links_.Request(shard, create, 0,
                 [this, shard, chunks](const Status& st, const wire::Header& h,
                                       std::span<const uint8_t> frame) {
                   if (!st.ok()) return OnReCreated(shard, st);
                   auto reply = wire::DecodeBody<wire::CreateReply>(h, frame);
                   if (!reply.ok()) return OnReCreated(shard, reply.status());
                   OnReCreated(shard,
                               links_[shard].TakeCreated(*reply, chunks, options_.cuda_device));
                 });
}

void ShardJoiner::OnReCreated(int shard, const Status& st) {
  ShardLink& link = links_[shard];
  link.joining.reconnecting = false;
  if (!st.ok()) {
    TLOG_WARN("{}: re-creating this worker's tensors failed: {}", link.name(), st.message());
    if (link.ep) link.ep->Abort();
    return;
  }
  link.dead = Status::Ok();
  if (shard == links_.coordinator_index()) links_.coordinator().Note(true);
  TLOG_INFO("{} is back{}", link.name(),
            link.task.job == "ps" ? "; this worker's tensors on it were created again" : "");
  if (on_back_) on_back_(shard);
}

void ShardJoiner::Handshake(int shard, std::function<void(Status)> done) {
  // A reply that never comes (a connection the far side dropped unseen)
  // must not hold this worker's start, or its reconnect, for ever: after
  // the deadline the caller connects again.
  struct Turn {
    std::function<void(Status)> done;
    uint64_t request = 0;  // the request waiting for its answer
  };
  auto turn = std::make_shared<Turn>(Turn{std::move(done), 0});
  auto fail = [this, shard, turn](const Status& st) {
    if (!turn->done) return;
    links_[shard].joining.request = 0;
    auto call = std::move(turn->done);
    turn->done = nullptr;
    call(st);
  };
  wire::Hello hello;
  hello.role = options_.read_only ? wire::PeerRole::kReader : wire::PeerRole::kWorker;
  hello.task_index = identity_.task_index;
  hello.task = options_.task.ToString();
  hello.node_id = identity_.ipc_node_id;
  hello.cluster = options_.cluster.ToJson();
  hello.protection = options_.session_protection;
  auto handshake = std::make_shared<wire::ClientHandshake>(options_.secret, std::move(hello));
  const ShardLink& link = links_[shard];
  const uint32_t expect_index =
      shard == links_.coordinator_index() && link.task.job == "coordinator"
          ? wire::kCoordinatorIndex
          : static_cast<uint32_t>(shard);
  // The hello's answer is a challenge, the auth's a welcome: each read by
  // the handshake itself (ClientHandshake::OnFrame).
  auto read =
      [handshake, expect_index, name = link.name()](
          const Status& st,
          std::span<const uint8_t> frame) -> Result<std::variant<wire::Auth, wire::Welcome>> {
    if (!st.ok()) return st;
    return handshake->OnFrame(frame, expect_index, name);
  };
  ctx_.PostAfter(handshake_timeout_, [this, turn, fail] {
    if (links_.stopping() || !turn->done) return;
    links_.Forget(turn->request);
    fail(Status::DeadlineExceeded("took the connection but did not finish the handshake within " +
                                  std::to_string(handshake_timeout_.count()) + " ms"));
  });
  links_[shard].joining.request = turn->request = links_.Request(
      shard, handshake->hello(), 0,
      [this, shard, read, fail, turn, handshake](const Status& st, const wire::Header&,
                                                 std::span<const uint8_t> frame) {
        auto auth = read(st, frame);
        if (!auth.ok()) return fail(auth.status());
        if (!std::holds_alternative<wire::Auth>(*auth)) {
          return fail(Status::Internal("a welcome before the challenge"));
        }
        links_[shard].joining.request = turn->request = links_.Request(
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

Status ShardJoiner::AcceptWelcome(int shard, const wire::Welcome& w,
                                  const wire::ClientHandshake& handshake) {
  ShardLink& s = links_[shard];
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

}  // namespace tessera::client
