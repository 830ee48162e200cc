// Where a shard's parameters live (--memory: host, or a GPU), whether the
// fabric reaches that memory or workers read values staged through host
// memory, what the chunks may take of it, and the slots each worker writes
// its pushes into (a staging slot, and on its node a CUDA IPC slot).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "server/apply.h"
#include "server/param_memory.h"
#include "server/peer.h"
#include "tessera/server.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace tessera::server {

class ShardMemory {
 public:
  // Opens --memory on `ctx`'s progress thread's GPU, if a GPU, and learns
  // whether the fabric reaches it (else staging, where allowed).
  static Result<std::unique_ptr<ShardMemory>> Open(const ServerOptions& options,
                                                   transport::Context& ctx);
  ShardMemory(const ShardMemory&) = delete;
  ShardMemory& operator=(const ShardMemory&) = delete;

  ParamMemory& memory() { return *memory_; }
  // What workers reach: the memory's kind, or host where values are staged.
  transport::MemoryKind arena_kind() const { return arena_kind_; }
  // Workers read a host copy of each value (the fabric cannot reach it).
  bool staged() const { return arena_kind_ != memory_->spec().kind; }
  // Where apply:: changes values; it counts the bytes staged here.
  apply::Target target() { return {memory_.get(), staged(), &staged_bytes_, memory_->is_host()}; }
  // What the chunks may take: memory_limit_bytes, or what the memory had
  // free at start (UINT64_MAX: unknown, no bound but the chunk limits).
  uint64_t budget() const { return budget_; }
  std::string Describe() const;
  // Progress thread: an authenticated worker's staging slot, bound to its
  // connection where the fabric can, and on this node of a GPU shard a CUDA
  // IPC slot, into its welcome.
  Status GiveWorkerSlots(Peer& peer, wire::Welcome* welcome);
  // Any thread.
  void AddStats(ServerStats* stats) const;

 private:
  ShardMemory(const ServerOptions& options, transport::Context& ctx, std::unique_ptr<ParamMemory> m,
              transport::MemoryKind kind)
      : options_(options), ctx_(ctx), memory_(std::move(m)), arena_kind_(kind) {}
  // A GPU: current on the progress thread, and reached by the fabric or
  // staged (allow_host_staging) or refused.
  Status DecideReach();
  Status SetBudget();
  // Same node, GPU memory: a GPU slot for `peer` and its IPC handle.
  Status OfferIpcSlot(Peer& peer, wire::Welcome* welcome);

  const ServerOptions& options_;
  transport::Context& ctx_;
  const std::unique_ptr<ParamMemory> memory_;
  transport::MemoryKind arena_kind_;
  uint64_t budget_ = UINT64_MAX;
  std::atomic<uint64_t> staged_bytes_{0}, cuda_ipc_workers_{0};
};

}  // namespace tessera::server
