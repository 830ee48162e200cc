#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/bounded_file.h"
#include "core/bytes.h"

namespace tessera::ckpt {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the safetensors library's own limit

Status Errno(const std::string& what) {
  return Status::Internal(what + ": " + std::strerror(errno));
}

Status WriteAll(int fd, const uint8_t* data, size_t len, const std::string& path) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("writing " + path);
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FsyncDir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("opening directory " + dir);
  int rc = fsync(fd);
  close(fd);
  return rc == 0 ? Status::Ok() : Errno("fsync of directory " + dir);
}

Status Bad(const std::string& path, const std::string& what) {
  return Status::DataLoss(path + ": " + what);
}

}  // namespace

const char* SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

Result<DType> ParseSafetensorsDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    if (name == SafetensorsDType(d)) return d;
  }
  return Status::Unimplemented("safetensors dtype '" + name +
                               "' is not one Tessera holds (F32, F64, F16, BF16, I32, I64)");
}

Status WriteFileAtomically(const std::string& path, std::span<const uint8_t> contents) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("creating " + tmp);
  Status st = WriteAll(fd, contents.data(), contents.size(), tmp);
  if (st.ok() && fsync(fd) != 0) st = Errno("fsync of " + tmp);
  if (close(fd) != 0 && st.ok()) st = Errno("closing " + tmp);
  if (st.ok() && rename(tmp.c_str(), path.c_str()) != 0)
    st = Errno("renaming " + tmp + " to " + path);
  if (!st.ok()) {
    unlink(tmp.c_str());
    return st;
  }
  return FsyncDir(path);
}

Result<std::vector<uint8_t>> EncodeSafetensorsHeader(const std::vector<TensorLayout>& tensors,
                                                     const Metadata& metadata,
                                                     std::vector<TensorEntry>* entries) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  entries->clear();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    auto n = NumElements(t.shape);
    if (!n.ok()) return n.status().WithContext("tensor '" + t.name + "'");
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return Status::InvalidArgument("tensor name '" + t.name + "' is reserved or repeated");
    }
    const uint64_t bytes = *n * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", SafetensorsDType(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    entries->push_back({t.name, t.dtype, t.shape, offset, offset + bytes});
    offset += bytes;
  }
  std::string text = header.dump();
  // The format pads the header with spaces to 8 bytes, so the data is aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + text.size());
  ByteWriter w(&out);
  w.Put(static_cast<uint64_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const Metadata& metadata) {
  std::vector<TensorLayout> layout;
  for (const auto& t : tensors) {
    auto n = NumElements(t.shape);
    if (!n.ok()) return n.status().WithContext("tensor '" + t.name + "'");
    if (*n * DTypeSize(t.dtype) != t.bytes.size()) {
      return Status::InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.bytes.size()) +
                                     " bytes for " + DescribeTensor(t.dtype, t.shape));
    }
    layout.push_back({t.name, t.dtype, t.shape});
  }
  std::vector<TensorEntry> entries;
  auto out = EncodeSafetensorsHeader(layout, metadata, &entries);
  if (!out.ok()) return out.status();
  for (const auto& t : tensors) out->insert(out->end(), t.bytes.begin(), t.bytes.end());
  return WriteFileAtomically(path, *out);
}

namespace {

// Checks a parsed header against the size of the byte area that follows it.
Status ParseHeader(const std::string& path, std::span<const uint8_t> text, uint64_t data_size,
                   std::vector<TensorEntry>* tensors, Metadata* metadata) {
  auto header = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return Bad(path, "header is not a JSON object");
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Bad(path, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) return Bad(path, "__metadata__ value of '" + k + "' is not a string");
        (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    std::string where = path;
    where += ": tensor '";
    where += name;
    where += "'";
    auto bad = [&](const std::string& what) {
      std::string msg = where;
      msg += ": ";
      msg += what;
      return Status::DataLoss(msg);
    };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      return bad("needs dtype, shape and data_offsets");
    }
    if (!value["dtype"].is_string()) return bad("dtype is not a string");
    auto dtype = ParseSafetensorsDType(value["dtype"].get<std::string>());
    if (!dtype.ok()) return dtype.status().WithContext(where);
    TensorEntry t{name, *dtype, {}, 0, 0};
    if (!value["shape"].is_array()) return bad("shape is not a list");
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape has a non-integer or negative dimension");
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return bad("data_offsets is not [begin, end]");
    }
    t.begin = offsets[0].get<uint64_t>();
    t.end = offsets[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size) {
      return bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                 "] lie outside the " + std::to_string(data_size) + " data bytes (truncated?)");
    }
    auto n = NumElements(t.shape);
    if (!n.ok() || *n > (uint64_t{1} << 50) || *n * DTypeSize(t.dtype) != t.end - t.begin) {
      return bad(DescribeTensor(t.dtype, t.shape) + " does not fit its " +
                 std::to_string(t.end - t.begin) + " bytes");
    }
    tensors->push_back(std::move(t));
  }
  // The byte area must be covered exactly: no overlaps, no holes.
  std::sort(tensors->begin(), tensors->end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const auto& t : *tensors) {
    if (t.begin != covered)
      return Bad(path, "tensor '" + t.name + "' overlaps another or leaves a hole");
    covered = t.end;
  }
  if (covered != data_size) {
    return Bad(path, std::to_string(data_size - covered) + " bytes after the last tensor");
  }
  return Status::Ok();
}

// The header length from the first 8 bytes, checked against the file size.
Result<uint64_t> HeaderLength(const std::string& path, std::span<const uint8_t> first8,
                              uint64_t file_size) {
  if (file_size < 8) return Bad(path, "shorter than the 8-byte header length (truncated?)");
  uint64_t header_len = 0;
  ByteReader r(first8);
  r.Get(&header_len);
  if (header_len > kMaxHeader)
    return Bad(path, "header length " + std::to_string(header_len) + " is beyond any real header");
  if (header_len > file_size - 8) {
    return Bad(path, "header says " + std::to_string(header_len) + " bytes but the file has " +
                         std::to_string(file_size - 8) + " after the length (truncated?)");
  }
  return header_len;
}

}  // namespace

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO would wait
  if (fd < 0) return Status::NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Errno("stat of " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return Status::InvalidArgument(path + " is not a regular file: refused");
  }
  SafetensorsHeader out;
  out.file_size = static_cast<uint64_t>(st.st_size);
  uint8_t first8[8] = {};
  const bool got8 = out.file_size >= 8 && pread(fd, first8, 8, 0) == 8;
  auto len = HeaderLength(path, first8, got8 ? out.file_size : 0);
  if (!len.ok()) {
    close(fd);
    return len.status();
  }
  std::vector<uint8_t> text(*len);
  const bool got = pread(fd, text.data(), text.size(), 8) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!got) return Errno("reading the header of " + path);
  out.data_start = 8 + *len;
  TESSERA_RETURN_IF_ERROR(
      ParseHeader(path, text, out.file_size - out.data_start, &out.tensors, &out.metadata));
  return out;
}

const TensorEntry* SafetensorsHeader::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  // Read whole (inspect and verify hash every tensor): a regular file only,
  // so that a link to a device is refused rather than read for ever.
  constexpr uint64_t kMaxWholeFileBytes = uint64_t{1} << 40;
  auto all = ReadBoundedFileBytes(path, kMaxWholeFileBytes, "the safetensors file");
  if (!all.ok()) return all.status();
  return Parse(path, std::move(*all));
}

Result<SafetensorsFile> SafetensorsFile::Parse(const std::string& where, std::vector<uint8_t> all) {
  auto len = HeaderLength(
      where, std::span<const uint8_t>(all).first(std::min<size_t>(8, all.size())), all.size());
  if (!len.ok()) return len.status();
  SafetensorsFile file;
  TESSERA_RETURN_IF_ERROR(ParseHeader(where, std::span<const uint8_t>(all).subspan(8, *len),
                                      all.size() - 8 - *len, &file.tensors_, &file.metadata_));
  all.erase(all.begin(), all.begin() + 8 + static_cast<long>(*len));
  file.data_ = std::move(all);
  return file;
}

const TensorEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string Sha256Hex(std::span<const uint8_t> bytes) {
  uint8_t digest[32];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  return ToHex(std::span<const uint8_t>(digest, len));
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace tessera::ckpt
