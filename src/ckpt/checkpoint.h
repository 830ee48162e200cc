// A Tessera checkpoint: one directory per saved step,
//
//   DIR/step-00000120/model-00001-of-00002.safetensors   one file per shard
//                     model-00002-of-00002.safetensors
//                     model.safetensors.index.json       Hugging Face's index
//                     tessera.json                       the manifest, written last
//
// A tensor is stored whole in one file (the file of the shard that holds its
// first chunk) whatever the number of chunks, so a checkpoint restores onto
// any number of shards. Optimizer state is stored beside it under derived
// names ("w/adam_m"). The round writes into DIR/.step-00000120.tmp and
// renames it when the manifest is in: a directory named step-N is complete
// unless its files were damaged later, which Open() detects.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_key.h"
#include "ckpt/safetensors.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::ckpt {

// What of a parameter chunk is stored: the value and the rule's state.
enum class Slot : uint8_t {
  kParam = 0,
  kState0 = 1,  // momentum buffer, Adam's first moment, Adagrad's sum
  kState1 = 2,  // Adam's second moment
  kMaster = 3,  // f32 master copy of an f16/bf16 parameter
};
constexpr int kNumSlots = 4;

// The slots a tensor with this dtype and rule keeps.
std::vector<Slot> SlotsOf(DType dtype, UpdateRule rule);
// "w", "w/momentum", "w/adam_m", "w/adam_v", "w/adagrad_sum", "w/master".
std::string SlotTensorName(const std::string& name, UpdateRule rule, Slot slot);
// Refuses a tensor name that ends the way a slot's name does ("x/adam_m"):
// in a checkpoint it could collide with another tensor's optimizer state.
Status CheckNotSlotName(const std::string& name);
// The dtype a slot is stored in: the parameter's; state is f64 for f64
// parameters and f32 otherwise; the master copy is f32.
DType SlotDType(DType param_dtype, Slot slot);

// One declared tensor as the manifest records it.
struct TensorRecord {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  UpdateRule rule = UpdateRule::kAssign;
  Hyperparams hyper;
  ConsistencyMode mode;
  uint64_t updates = 0;  // optimizer steps applied (Adam's bias correction)
  uint32_t file = 0;     // index into Manifest::files
};

struct FileRecord {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  std::string sha256;
};

struct Manifest {
  // 3: an HMAC beside it under the checkpoint key (checkpoint_key.h), and
  // a SHA-256 digest. 2: the digest only; 1: neither, nor the index file.
  // Versions 1 and 2 can be edited undetectably by whoever may write them:
  // read only when asked to (OpenOptions::accept_legacy).
  int version = 3;
  uint64_t global_step = 0;
  int64_t unix_time = 0;
  uint32_t num_shards = 0;
  std::string cluster;  // the cluster spec, as JSON text
  std::vector<FileRecord> files;
  FileRecord index;  // model.safetensors.index.json (version 2)
  std::vector<TensorRecord> tensors;

  std::string ToJson() const;
  static Result<Manifest> FromJson(const std::string& text, const std::string& where);
};

// "model-00001-of-00004.safetensors".
std::string ShardFileName(uint32_t index, uint32_t count);
// "step-00000120".
std::string StepDirName(uint64_t step);
constexpr const char* kManifestName = "tessera.json";
constexpr const char* kIndexName = "model.safetensors.index.json";
// The manifest's SHA-256 in hex, written after the manifest: a damaged
// manifest no longer matches it, which anyone can check.
constexpr const char* kManifestDigestName = "tessera.json.sha256";
// Its HMAC under the checkpoint key, in hex, written last: an edited
// manifest no longer matches it, which only a holder of the key can fix.
constexpr const char* kManifestHmacName = "tessera.json.hmac";
// A checkpoint being pruned is first renamed to this prefix + its name, so
// that a crash halfway through deleting it leaves no damaged step-N behind.
constexpr const char* kPrunePrefix = ".pruning-";

// Where each slot of each tensor lies in the files of a checkpoint.
struct PlacedSlot {
  uint32_t file = 0;
  uint64_t offset = 0;  // file offset of the slot's first byte
  uint64_t bytes = 0;
};
struct CheckpointLayout {
  std::vector<std::vector<uint8_t>> headers;  // per file: length and JSON header
  std::vector<uint64_t> file_sizes;
  // (tensor name, slot) -> place
  std::map<std::pair<std::string, Slot>, PlacedSlot> slots;
  // Hugging Face's model.safetensors.index.json.
  std::string IndexJson(const Manifest& m) const;
  // DataLoss unless `index_text` (read from `path`) says what IndexJson
  // says: which file holds each stored tensor, and how many bytes they take.
  Status CheckIndex(const Manifest& m, const std::string& index_text,
                    const std::string& path) const;
};
// Lays out the manifest's tensors (sorted by name within each file).
Result<CheckpointLayout> PlanCheckpoint(const Manifest& manifest);

struct OpenOptions {
  bool verify_data = true;  // also every file's SHA-256 (the bytes read through)
  // Also a manifest of version 1 or 2, which has no HMAC to check.
  bool accept_legacy = false;
  // The key the manifest's HMAC is checked with. None: its SHA-256 only
  // (integrity, not authenticity), and Checkpoint::authenticated is false.
  std::optional<CheckpointKey> key;
};

// A complete checkpoint found on disk and checked.
struct Checkpoint {
  std::string path;  // the step directory
  Manifest manifest;
  CheckpointLayout layout;
  bool authenticated = false;  // its HMAC checked out under OpenOptions::key
  const TensorRecord* Find(const std::string& name) const;

  // Checks the manifest against its HMAC (given a key) and digest and the
  // directory's name (step-N for its global step), the index against the
  // layout (weight_map, total_size, its recorded SHA-256), and every file
  // against the manifest: present, of the recorded size, with a header that
  // matches the planned layout, and (verify_data) the recorded SHA-256. A
  // damaged or edited checkpoint is refused with an error naming the file
  // and what is wrong. A manifest of version 1 or 2 (written before HMACs)
  // has nothing to authenticate it by, and one made so by editing its
  // version looks the same: refused unless `accept_legacy`.
  static Result<Checkpoint> Open(const std::string& step_dir, const OpenOptions& options);

  // Reads `len` bytes at `offset` within a tensor's slot.
  Status ReadSlot(const std::string& name, Slot slot, uint64_t offset, uint64_t len,
                  void* out) const;
};

// The step directories under `dir`, newest first (complete or not).
std::vector<std::string> ListStepDirs(const std::string& dir);
// A new run in `dir`: its step directories (an earlier run's) are moved,
// not deleted, into `dir`/earlier-run-<UTC time>/. Returns that directory,
// or empty when there was nothing to move.
Result<std::string> MoveStepDirsAside(const std::string& dir);
// The newest checkpoint under `dir` that opens; damaged newer ones are
// skipped with a warning naming why. NotFound when there is no step
// directory; DataLoss naming each when there are some and none opens.
Result<Checkpoint> FindNewestCheckpoint(const std::string& dir, const OpenOptions& options);

// SHA-256 of a whole file, read in pieces (of bytes in memory: Sha256Hex,
// safetensors.h).
Result<std::string> Sha256OfFile(const std::string& path);

// Bytes a shard writes into the files of a round, at their planned offsets.
struct Piece {
  uint32_t file = 0;
  uint64_t offset = 0;
  std::vector<uint8_t> bytes;
};
// Writes the pieces into the (already created) files `dir`/`files`[i] and
// fsyncs every file it touched.
Status WritePieces(const std::string& dir, const std::vector<std::string>& files,
                   const std::vector<Piece>& pieces);

// Creates `path` holding `header` and sized to `size` bytes (the tensors'
// bytes are written later, in place, by the shards), and fsyncs it.
Status CreateSizedFile(const std::string& path, std::span<const uint8_t> header, uint64_t size);

// Creates `dir` if needed and proves that files can be created, written and
// synced in it; otherwise FailedPrecondition naming the path and why.
Status CheckWritableDirectory(const std::string& dir);

// Fsyncs a directory, so the names created or renamed in it persist.
Status FsyncDirectory(const std::string& dir);

// For the crash tests: TESSERA_CKPT_CRASH_AT=NAME or NAME:N kills this
// process with SIGKILL the first (or Nth) time it reaches the point NAME.
void CrashPoint(const char* name);

}  // namespace tessera::ckpt
