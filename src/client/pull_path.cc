// The pull path: a pull split by shard, the bytes inline in the reply or
// read one-sided under a lease.

#include <algorithm>
#include <cstring>

#include "client/client_impl.h"

namespace tessera {
namespace {

// How long a shard may hold a pull before answering what it still waits for
// (who has not pushed a sync step): a little less than the op timeout, so
// that its answer, not the bare timeout, reaches the caller.
uint32_t ShardWaitMs(std::chrono::milliseconds op_timeout) {
  const auto margin =
      std::clamp(op_timeout / 5, std::chrono::milliseconds(10), std::chrono::milliseconds(2000));
  const auto wait = std::max(op_timeout - margin, std::chrono::milliseconds(1));
  return static_cast<uint32_t>(std::min<int64_t>(wait.count(), UINT32_MAX));
}

}  // namespace

void Client::Impl::PullFromShard(int shard, ChunkIos ios, const PartDone& done) {
  if (const ShardConn& s = shards_[shard]; !s.dead.ok()) {
    // Lost, or being joined again: nothing may go to it before its
    // handshake and re-create are done.
    Reconnect(shard);  // fails this call; a later one may succeed
    return done(s.dead);
  }
  if (Status st = GpuPathTo(shards_[shard], ios); !st.ok()) return done(st.WithContext("pull"));
  wire::Pull& msg = pull_scratch_;  // encoded at once by Request
  msg.entries.clear();
  for (const auto& io : ios) msg.entries.push_back({io.chunk->key_id, io.min_version, io.min_step});
  msg.inline_max = static_cast<uint32_t>(std::min(options_.inline_bytes, wire::kMaxInlineBytes));
  msg.wait_ms = ShardWaitMs(options_.op_timeout);
  Request(shard, msg, 0,
          // `done` copied as a PartDone, not a const one: a const member
          // would make the handler's move a copy, which keeps it off the
          // inline buffer (see core/inline_function.h).
          [this, shard, ios = std::move(ios), done = PartDone(done)](
              const Status& st, const wire::Header& h, std::span<const uint8_t> frame) mutable {
            if (!st.ok()) return done(st);
            wire::PullReply& reply = pull_reply_scratch_;
            if (Status decoded = wire::DecodeBodyInto(h, frame, &reply); !decoded.ok()) {
              return done(decoded);
            }
            AcceptPullReply(shard, std::move(ios), reply, done);
          });
}

void Client::Impl::AcceptPullReply(int shard, ChunkIos ios, const wire::PullReply& reply,
                                   const PartDone& done) {
  if (reply.lease_id == 0) {
    // The bytes came inline: no lease to give back.
    uint64_t total = 0;
    for (const auto& io : ios) total += io.chunk->bytes;
    if (total != reply.data.size()) {
      return done(Status::Internal("inline pull reply of " + std::to_string(reply.data.size()) +
                                   " bytes for " + std::to_string(total)));
    }
    const uint8_t* src = reply.data.data();
    bool to_gpu = false;
    for (const auto& io : ios) {
      if (io.on_gpu) {
        if (Status st2 = GpuCopyAsync(io.local, src, io.chunk->bytes); !st2.ok()) {
          return done(st2.WithContext("pull into GPU memory"));
        }
        gpu_inline_bytes_ += io.chunk->bytes;
        to_gpu = true;
      } else {
        std::memcpy(io.local, src, io.chunk->bytes);
      }
      src += io.chunk->bytes;
    }
    // The reply's bytes must stay until the copies are done.
    return done(to_gpu ? GpuWait().WithContext("pull into GPU memory") : Status::Ok());
  }
  ShardConn& s = shards_[shard];
  // What the gets share, from the pool: each get's completion holds only
  // `this`, this and `finish_once`, and so stays inside its Completion (no
  // allocation per get).
  struct Progress {
    int outstanding;
    Status status;
    bool finished = false;
    int shard;
    uint64_t op_id;
    uint64_t lease;
    PartDone done;
    // The chunks: where a gathered get's bytes are copied out to.
    ChunkIos ios;
    // GPU chunks read into host memory, copied up once every get is done.
    std::vector<uint8_t> bounce;
    std::vector<std::pair<uint8_t*, size_t>> bounce_to;  // (GPU destination, bytes)
  };
  auto progress = std::allocate_shared<Progress>(PoolAllocator<Progress>(),
                                                 Progress{static_cast<int>(ios.size()),
                                                          Status::Ok(),
                                                          false,
                                                          shard,
                                                          s.next_op++,
                                                          reply.lease_id,
                                                          done,
                                                          {},
                                                          {},
                                                          {}});
  // Runs once: when the gets are done, on a failure, or when the shard is
  // lost. It holds only `this`, so the gets' completions can hold it too.
  auto finish_once = [this](Progress& p, const Status& result) {
    if (p.finished) return;
    p.finished = true;
    shards_[p.shard].in_flight.erase(p.op_id);
    p.done(result);
  };
  auto finish = [finish_once, progress](const Status& result) { finish_once(*progress, result); };
  s.in_flight[progress->op_id] = finish;
  const uint64_t lease = reply.lease_id;
  // Same node, GPU shard: device copies out of the mapped arenas. Else,
  // GPU chunks on a fabric that cannot reach GPU memory are read into
  // host memory and copied up once the gets are done (counted).
  bool all_mapped = !ios.empty();
  for (const auto& io : ios) all_mapped &= s.ipc_arenas.count(io.chunk->arena_id) > 0;
  if (all_mapped) {
    Status copied;
    uint64_t bytes = 0;
    for (const auto& io : ios) {
      const uint8_t* src = s.ipc_arenas.at(io.chunk->arena_id).data() + io.chunk->arena_offset;
      if (copied.ok()) copied = GpuCopyAsync(io.local, src, io.chunk->bytes);
      bytes += io.chunk->bytes;
    }
    if (copied.ok()) copied = GpuWait();
    ipc_bytes_ += copied.ok() ? bytes : 0;
    if (s.dead.ok() && s.ep) s.ep->Send(kProtocolMsg, wire::Encode(wire::Release{lease}, 0));
    return finish(copied.WithContext("copying from the CUDA IPC mapping of " + s.name()));
  }
  std::vector<uint8_t*> into;  // where each get lands, when some are staged
  if (!fabric_gpu_.ok()) {
    uint64_t need = 0;
    for (const auto& io : ios) need += io.on_gpu ? io.chunk->bytes : 0;
    if (need > 0) {
      progress->bounce.resize(need);
      uint64_t at = 0;
      for (const auto& io : ios) {
        into.push_back(io.on_gpu ? progress->bounce.data() + at : io.local);
        if (!io.on_gpu) continue;
        progress->bounce_to.emplace_back(io.local, io.chunk->bytes);
        at += io.chunk->bytes;
      }
    }
  }
  // Chunks [first, end) are read: from `gathered`, when they came in one
  // get through the gather buffer, copied out to where each belongs (unless
  // the pull already ended: the shard was lost, and the caller's memory may
  // be gone) and the buffer given back. The last chunk read ends the pull.
  // Each get's completion holds this, the Progress and its chunks (48 bytes
  // at most: inside its Completion).
  auto read = [this, finish_once](Progress& p, const Status& st2, uint32_t first, uint32_t end,
                                  const uint8_t* gathered) {
    if (gathered != nullptr) {
      if (st2.ok() && !p.finished) {
        const uint64_t base = p.ios[first].chunk->arena_offset;
        for (uint32_t i = first; i < end; ++i) {
          const Chunk* c = p.ios[i].chunk;
          std::memcpy(p.ios[i].local, gathered + (c->arena_offset - base), c->bytes);
        }
      }
      shards_[p.shard].gather.Give(gathered);
    }
    if (!st2.ok() && p.status.ok()) p.status = st2;
    p.outstanding -= static_cast<int>(end - first);
    if (p.outstanding > 0) return;
    if (!p.bounce.empty() && p.status.ok()) {
      const uint8_t* src = p.bounce.data();
      Status up;
      for (const auto& [dst, n] : p.bounce_to) {
        if (up.ok()) up = GpuCopyAsync(dst, src, n);
        src += n;
      }
      if (up.ok()) up = GpuWait();
      if (up.ok()) staged_bytes_ += p.bounce.size();
      p.status = up.WithContext("staging into GPU memory through host memory");
    }
    // The bytes are ours: let the shard update them again.
    ShardConn& conn = shards_[p.shard];
    if (conn.dead.ok() && conn.ep)
      conn.ep->Send(kProtocolMsg, wire::Encode(wire::Release{p.lease}, 0));
    finish_once(p, p.status.ok() ? p.status : ShardError(p.shard, p.status));
  };
  progress->ios = std::move(ios);
  const ChunkIos& chunks = progress->ios;
  const uint64_t gather_up_to = s.ep->GatherUpTo();
  // Chunks [batch_first, batch_first + batch.size()) are read as they are,
  // from one arena, in one batch (Endpoint::GetMany: a fabric that copies
  // them itself copies them back to back). Issued when the next chunk
  // cannot join it, and at the end.
  std::vector<transport::RmaPiece, PoolAllocator<transport::RmaPiece>> batch;
  batch.reserve(chunks.size());
  uint32_t batch_first = 0;
  const transport::RemoteRegion* batch_arena = nullptr;
  auto issue_batch = [&] {
    if (batch.empty()) return;
    const auto end = static_cast<uint32_t>(batch_first + batch.size());
    s.ep->GetMany(batch, *batch_arena,
                  [read, progress, first = batch_first, end](const Status& st) {
                    read(*progress, st, first, end, nullptr);
                  });
    batch.clear();
  };
  for (size_t k = 0; k < chunks.size();) {
    const auto first = static_cast<uint32_t>(k);
    const Chunk* chunk = chunks[k].chunk;
    auto arena = s.arenas.find(chunk->arena_id);
    if (arena == s.arenas.end() || arena->second.get() != batch_arena) issue_batch();
    if (arena == s.arenas.end()) {
      read(*progress,
           Status::Internal("no key for arena " + std::to_string(chunk->arena_id) + " of " +
                            s.name()),
           first, first + 1, nullptr);
      ++k;
      continue;
    }
    const uint64_t at = arena->second->base() + chunk->arena_offset;
    // A run of small host chunks that lie next to each other in one arena
    // comes in one get through the gather buffer; the bytes between them
    // (padding, tensors this pull left out) are read and dropped.
    const auto run = client::GatherBuffer::RunFrom(
        k, chunks.size(), gather_up_to, [&](size_t i) -> std::optional<client::PeerSpan> {
          const Chunk* c = chunks[i].chunk;
          if (chunks[i].on_gpu || c->arena_id != chunk->arena_id) return std::nullopt;
          return client::PeerSpan{c->arena_offset, c->bytes};
        });
    uint8_t* gathered = run.end - k >= 2 ? s.gather.Take(*ctx_, run.span) : nullptr;
    if (gathered == nullptr) {
      if (batch.empty()) {
        batch_first = first;
        batch_arena = arena->second.get();
      }
      batch.push_back({into.empty() ? chunks[k].local : into[k], chunk->bytes, at});
      ++k;
      continue;
    }
    issue_batch();
    const auto end = static_cast<uint32_t>(run.end);
    s.ep->Get(gathered, run.span, *arena->second, at,
              [read, progress, first, end, gathered](const Status& st) {
                read(*progress, st, first, end, gathered);
              });
    k = run.end;
  }
  issue_batch();
}

Future Client::Impl::Pull(const std::vector<PullItem>& items, const CallOptions& call) {
  auto by_shard = SplitByShard(items, "pull", nullptr);
  if (!by_shard.ok()) return FailedFuture(by_shard.status());
  return FanOut(
      std::move(*by_shard),
      [this](int shard, ChunkIos ios, const std::shared_ptr<Future::State>& op) {
        // A pull may always be sent again.
        IssuePart(shard, std::move(ios), op, /*retryable=*/true,
                  [this, shard](ChunkIos part, const PartDone& done) {
                    PullFromShard(shard, std::move(part), done);
                  });
      },
      call);
}

}  // namespace tessera
