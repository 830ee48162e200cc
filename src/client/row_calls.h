// Embedding tables from the worker's side (issue 45): their declarations,
// through the coordinator and then a create on every ps task, and pulls and
// pushes by id. A call's ids are made distinct (a pushed id's rows summed in
// f32 in the order given, so that a push does not depend on timing), split
// by the ps task that holds each (core/row_placement.h) and into messages
// whose rows fit one (wire::kMaxRowBytesPerMessage), sent on the loop
// thread; a pull's rows land in the caller's buffer as replies arrive, an
// id that repeats copied once every part is in. Declare on the control
// queue's thread; Pull and Push on any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "client/fan_out.h"
#include "client/shard_links.h"
#include "core/row_placement.h"
#include "tessera/client.h"
#include "wire/row_messages.h"

namespace tessera::client {

class RowCalls {
 public:
  RowCalls(uint32_t client_id, const ClientOptions& options, transport::Context& ctx,
           ShardLinks& links, FanOut& fan_out);

  // The control queue's thread. A read-only client is refused.
  Result<Embedding> Declare(const EmbeddingSpec& spec);
  Future Pull(Embedding table, std::span<const int64_t> ids, void* rows, uint64_t min_step);
  Future Push(Embedding table, std::span<const int64_t> ids, const void* grads,
              std::optional<uint64_t> step);

 private:
  struct Declared {
    wire::EmbeddingDecl decl;
    uint32_t table_id = 0;
  };
  // The declaration a handle names, or an error naming what is wrong with it.
  Result<Declared> Lookup(Embedding table) const;
  Result<wire::EmbeddingDecl> ToDecl(const EmbeddingSpec& spec) const;
  // A push's messages: its rows by ps task, in messages that fit; for a
  // sync table each task's last message ends the step (one with no rows
  // for a task the push has none for).
  std::vector<std::pair<int, wire::RowsPush>> PushMessages(const Declared& table,
                                                           std::span<const int64_t> ids,
                                                           const uint8_t* grads, uint64_t step);
  // Sends each message of a call on the loop thread; `op` finishes once
  // per message, with `on_reply(k, status, header, frame)`'s outcome.
  template <typename Msg, typename OnReply>
  void Send(std::vector<std::pair<int, Msg>> messages, const std::shared_ptr<Future::State>& op,
            OnReply on_reply);

  const uint32_t client_id_;
  const ClientOptions& options_;  // the client's, which outlive this
  transport::Context& ctx_;
  ShardLinks& links_;
  FanOut& fan_out_;
  const RowPlacement placement_;
  mutable std::mutex mu_;
  std::vector<Declared> tables_;  // under mu_; by Embedding::index
};

}  // namespace tessera::client
