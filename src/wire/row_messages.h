// The messages of embedding tables (issue 45): a table declared to the
// coordinator and created on every ps task, rows pulled and pushed by id.
// As every message, each decoder checks what it can without the receiver's
// state (names, dims, dtypes, rules, counts, sizes); the shard checks the
// table id and the rows' bytes against the table it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/pool_allocator.h"
#include "tessera/client.h"
#include "wire/messages.h"

namespace tessera::wire {

// A row is at most this wide: 64 KiB of f32, so that one row always fits
// a message and a shard's state per row stays bounded.
constexpr uint32_t kMaxEmbeddingDim = 1u << 14;
// Tables one cluster may declare: table ids run from 1 to this, so that
// no peer can make the coordinator or a ps task hold more.
constexpr uint32_t kMaxEmbeddingTables = 4096;
// Ids per pull or push message; a call with more is split by the worker.
constexpr uint32_t kMaxIdsPerMessage = 1u << 16;
// Bytes of rows in one message (a pull's reply, a push's gradients); the
// worker splits a call so that each message's rows fit.
constexpr size_t kMaxRowBytesPerMessage = size_t{8} << 20;

struct EmbeddingDecl {
  std::string name;
  uint32_t dim = 0;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  UpdateRule rule = UpdateRule::kAdagrad;
  Hyperparams hyper;
  FtrlHyperparams ftrl;
  Initializer initializer;
  ConsistencyMode mode;  // with its zeros filled in by the declaring client
  uint64_t max_rows_per_shard = 0;
  bool operator==(const EmbeddingDecl&) const = default;
};
// What a declared table must satisfy, whoever checks it: the client before
// it sends, every receiver as it decodes.
Status ValidateEmbeddingDecl(const EmbeddingDecl& t);

// To the coordinator: this table, as this worker declares it.
struct DeclareTable {
  static constexpr Opcode kOpcode = Opcode::kDeclareTable;
  EmbeddingDecl table;
  void EncodeBody(MessageWriter& w) const;
  static Result<DeclareTable> DecodeBody(ByteReader& r);
  bool operator==(const DeclareTable&) const = default;
};

// The table's id, the same for every worker and shard; its declaration as
// the first declarer gave it (a later declaration that differs was refused).
struct DeclareTableReply {
  static constexpr Opcode kOpcode = Opcode::kDeclareTableReply;
  uint32_t table_id = 0;
  EmbeddingDecl table;
  void EncodeBody(MessageWriter& w) const;
  static Result<DeclareTableReply> DecodeBody(ByteReader& r);
  bool operator==(const DeclareTableReply&) const = default;
};

// To every ps task: hold this table's rows (answered with an ack).
struct CreateTable {
  static constexpr Opcode kOpcode = Opcode::kCreateTable;
  uint32_t table_id = 0;
  EmbeddingDecl table;
  void EncodeBody(MessageWriter& w) const;
  static Result<CreateTable> DecodeBody(ByteReader& r);
  bool operator==(const CreateTable&) const = default;
};

using RowIds = std::vector<int64_t, PoolAllocator<int64_t>>;

// The rows of `ids` (distinct, all held by this shard), in their order.
struct RowsPull {
  static constexpr Opcode kOpcode = Opcode::kRowsPull;
  uint32_t table_id = 0;
  uint64_t min_step = 0;  // sync: applied steps; bounded: steps every worker pushed
  uint32_t wait_ms = 0;   // how long the shard may hold it for min_step
  RowIds ids;
  size_t EncodedSizeHint() const { return 20 + ids.size() * 8; }
  void EncodeBody(MessageWriter& w) const;
  static Result<RowsPull> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, RowsPull* m);
  bool operator==(const RowsPull&) const = default;
};

struct RowsPullReply {
  static constexpr Opcode kOpcode = Opcode::kRowsPullReply;
  std::vector<uint8_t> rows;  // len(ids) x dim elements of the table's dtype
  size_t EncodedSizeHint() const { return 4 + rows.size(); }
  void EncodeBody(MessageWriter& w) const;
  static Result<RowsPullReply> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, RowsPullReply* m);
  bool operator==(const RowsPullReply&) const = default;
};

// Gradient rows of `ids` (distinct), in the table's dtype. With
// end_of_step, this worker has sent every push of `step` for this table to
// this shard (sync tables; ids may then be empty).
struct RowsPush {
  static constexpr Opcode kOpcode = Opcode::kRowsPush;
  uint32_t table_id = 0;
  uint64_t step = 0;
  bool end_of_step = false;
  RowIds ids;
  std::vector<uint8_t> grads;
  size_t EncodedSizeHint() const { return 25 + ids.size() * 8 + grads.size(); }
  void EncodeBody(MessageWriter& w) const;
  static Result<RowsPush> DecodeBody(ByteReader& r);
  static Status DecodeBodyInto(ByteReader& r, RowsPush* m);
  bool operator==(const RowsPush&) const = default;
};

// What became of a push's rows.
struct RowsPushReply {
  static constexpr Opcode kOpcode = Opcode::kRowsPushReply;
  uint32_t applied = 0;    // applied, or counted towards their sync step
  uint32_t created = 0;    // of those, rows made by this push
  uint32_t dropped = 0;    // sync: their step was already applied
  uint32_t nonfinite = 0;  // rows with a NaN or Inf gradient, not applied
  void EncodeBody(MessageWriter& w) const;
  static Result<RowsPushReply> DecodeBody(ByteReader& r);
  bool operator==(const RowsPushReply&) const = default;
};

}  // namespace tessera::wire
