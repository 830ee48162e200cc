// Checkpoint files in the safetensors format, so PyTorch, JAX and Hugging Face
// tools read Tessera checkpoints directly:
//
//   u64 little-endian N | N bytes of JSON header | raw tensor bytes
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets into the byte area) and may hold "__metadata__", a
// map of strings. Writes are crash-safe: a temporary file in the same
// directory, fsync, rename over the target, fsync of the directory. Reads
// check every field against the file and refuse a file whose header lies.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera::ckpt {

// "F32", "F64", "F16", "BF16", "I32", "I64".
const char* SafetensorsDType(DType dtype);
Result<DType> ParseSafetensorsDType(const std::string& name);

struct TensorToWrite {
  std::string name;
  DType dtype;
  Shape shape;
  std::span<const uint8_t> bytes;  // exactly the shape's bytes
};

using Metadata = std::map<std::string, std::string>;

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const Metadata& metadata = {});

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // in the byte area
};

// The 8-byte length and JSON header of a file holding `tensors` (their bytes
// follow in this order, without gaps), padded so that the data is 8-byte
// aligned. `entries` gets each tensor's place in the byte area.
struct TensorLayout {
  std::string name;
  DType dtype;
  Shape shape;
};
Result<std::vector<uint8_t>> EncodeSafetensorsHeader(const std::vector<TensorLayout>& tensors,
                                                     const Metadata& metadata,
                                                     std::vector<TensorEntry>* entries);

// A file's header, read and checked against the file's size without reading
// the tensors: what a restore needs to read parts of tensors in place.
struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // in file order
  Metadata metadata;
  uint64_t data_start = 0;  // file offset of the byte area
  uint64_t file_size = 0;
  const TensorEntry* Find(const std::string& name) const;
};
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// A whole file read and checked.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Read(const std::string& path);
  // The same checks on a file's bytes already in memory; `where` names them
  // in errors.
  static Result<SafetensorsFile> Parse(const std::string& where, std::vector<uint8_t> all);

  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // in file order
  const Metadata& metadata() const { return metadata_; }
  const TensorEntry* Find(const std::string& name) const;
  std::span<const uint8_t> Bytes(const TensorEntry& t) const {
    return std::span<const uint8_t>(data_).subspan(t.begin, t.end - t.begin);
  }

 private:
  std::vector<TensorEntry> tensors_;
  Metadata metadata_;
  std::vector<uint8_t> data_;
};

// SHA-256 of the bytes, as 64 hex digits.
std::string Sha256Hex(std::span<const uint8_t> bytes);
std::string ToHex(std::span<const uint8_t> bytes);

// Writes `contents` to `path` crash-safely (temporary file, fsync, rename,
// fsync of the directory).
Status WriteFileAtomically(const std::string& path, std::span<const uint8_t> contents);

}  // namespace tessera::ckpt
