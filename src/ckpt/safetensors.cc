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

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const Metadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    auto n = NumElements(t.shape);
    if (!n.ok()) return n.status().WithContext("tensor '" + t.name + "'");
    if (*n * DTypeSize(t.dtype) != t.bytes.size()) {
      return Status::InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.bytes.size()) +
                                     " bytes for " + DescribeTensor(t.dtype, t.shape));
    }
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return Status::InvalidArgument("tensor name '" + t.name + "' is reserved or repeated");
    }
    header[t.name] = {{"dtype", SafetensorsDType(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  // The format pads the header with spaces to 8 bytes, so the data is aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  ByteWriter w(&out);
  w.Put(static_cast<uint64_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return WriteFileAtomically(path, out);
}

Result<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::vector<uint8_t> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() < 8) return Bad(path, "shorter than the 8-byte header length (truncated?)");
  uint64_t header_len = 0;
  ByteReader r(all);
  r.Get(&header_len);
  if (header_len > kMaxHeader)
    return Bad(path, "header length " + std::to_string(header_len) + " is beyond any real header");
  if (header_len > all.size() - 8) {
    return Bad(path, "header says " + std::to_string(header_len) + " bytes but the file has " +
                         std::to_string(all.size() - 8) + " after the length (truncated?)");
  }
  auto header =
      nlohmann::json::parse(all.begin() + 8, all.begin() + 8 + static_cast<long>(header_len),
                            nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return Bad(path, "header is not a JSON object");

  SafetensorsFile file;
  const uint64_t data_size = all.size() - 8 - header_len;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Bad(path, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) return Bad(path, "__metadata__ value of '" + k + "' is not a string");
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    std::string where = path;
    where += ": tensor '";
    where += name;
    where += "'";
    auto bad = [&](const std::string& what) { return Status::DataLoss(where + ": " + what); };
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
    file.tensors_.push_back(std::move(t));
  }
  // The byte area must be covered exactly: no overlaps, no holes.
  std::vector<const TensorEntry*> by_offset;
  for (const auto& t : file.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  uint64_t covered = 0;
  for (const auto* t : by_offset) {
    if (t->begin != covered)
      return Bad(path, "tensor '" + t->name + "' overlaps another or leaves a hole");
    covered = t->end;
  }
  if (covered != data_size) {
    return Bad(path, std::to_string(data_size - covered) + " bytes after the last tensor");
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  file.data_.assign(all.begin() + 8 + static_cast<long>(header_len), all.end());
  return file;
}

const TensorEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string Sha256Hex(std::span<const uint8_t> bytes) {
  unsigned char digest[32];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace tessera::ckpt
