// The file work of a checkpoint: hashing, positioned writes of the shards'
// pieces, files created at their final size, directory fsyncs, and the
// crash points the tests use to kill a round at each step.
#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "ckpt/checkpoint.h"
#include "core/bytes.h"
#include "core/log.h"

namespace tessera::ckpt {

namespace fs = std::filesystem;

Result<std::string> Sha256OfFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound("cannot open " + path + ": " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr);
  std::vector<uint8_t> buf(1 << 20);
  Status st;
  while (true) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      st = Status::Internal("reading " + path + ": " + std::strerror(errno));
      break;
    }
    if (n == 0) break;
    EVP_DigestUpdate(md.get(), buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  if (!st.ok()) return st;
  uint8_t digest[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md.get(), digest, &len);
  return ToHex(std::span<const uint8_t>(digest, len));
}

Status WritePieces(const std::string& dir, const std::vector<std::string>& files,
                   const std::vector<Piece>& pieces) {
  std::map<uint32_t, int> fds;
  Status st;
  auto open_file = [&](uint32_t f) -> int {
    auto it = fds.find(f);
    if (it != fds.end()) return it->second;
    const std::string path = dir + "/" + files[f];
    int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) st = Status::NotFound("cannot open " + path + ": " + std::strerror(errno));
    fds[f] = fd;
    return fd;
  };
  bool first = true;
  for (const auto& piece : pieces) {
    if (piece.file >= files.size()) {
      st = Status::InvalidArgument("piece for file " + std::to_string(piece.file));
      break;
    }
    int fd = open_file(piece.file);
    if (fd < 0) break;
    const uint8_t* src = piece.bytes.data();
    uint64_t left = piece.bytes.size(), pos = piece.offset;
    while (left > 0) {
      ssize_t n = pwrite(fd, src, left, static_cast<off_t>(pos));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        st = Status::Internal("writing " + dir + "/" + files[piece.file] + ": " +
                              std::strerror(errno));
        break;
      }
      src += n;
      pos += static_cast<uint64_t>(n);
      left -= static_cast<uint64_t>(n);
    }
    if (!st.ok()) break;
    if (first) CrashPoint("shard-write");  // some bytes are in, others not yet
    first = false;
  }
  for (auto [f, fd] : fds) {
    if (fd < 0) continue;
    if (st.ok() && fsync(fd) != 0) {
      st = Status::Internal("fsync of " + dir + "/" + files[f] + ": " + std::strerror(errno));
    }
    close(fd);
  }
  return st;
}

Status CreateSizedFile(const std::string& path, std::span<const uint8_t> header, uint64_t size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Internal("creating " + path + ": " + std::strerror(errno));
  Status st;
  if (pwrite(fd, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size()) ||
      ftruncate(fd, static_cast<off_t>(size)) != 0 || fsync(fd) != 0) {
    st = Status::Internal("writing " + path + ": " + std::strerror(errno));
  }
  close(fd);
  return st;
}

Status CheckWritableDirectory(const std::string& dir) {
  auto refuse = [&](const std::string& why) {
    return Status::FailedPrecondition("checkpoint directory " + dir + " is not writable: " + why);
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return refuse(ec.message());
  const std::string probe = dir + "/.tessera-write-test-" + std::to_string(getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return refuse(std::strerror(errno));
  const char byte = 0;
  const bool ok = write(fd, &byte, 1) == 1 && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  unlink(probe.c_str());
  if (!ok) return refuse(std::strerror(err));
  return Status::Ok();
}

Status FsyncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Internal("opening directory " + dir + ": " + std::strerror(errno));
  int rc = fsync(fd);
  close(fd);
  return rc == 0 ? Status::Ok()
                 : Status::Internal("fsync of directory " + dir + ": " + std::strerror(errno));
}

void CrashPoint(const char* name) {
  static const char* spec = getenv("TESSERA_CKPT_CRASH_AT");
  if (spec == nullptr) return;
  static std::mutex mu;
  static std::map<std::string, int> reached;
  std::lock_guard<std::mutex> lock(mu);
  std::string want = spec;
  int nth = 1;
  if (auto colon = want.find(':'); colon != std::string::npos) {
    nth = std::atoi(want.c_str() + colon + 1);
    want.resize(colon);
  }
  if (want != name || ++reached[want] != nth) return;
  TLOG_WARN("TESSERA_CKPT_CRASH_AT={}: killing this process at '{}'", spec, name);
  Logger().flush();
  raise(SIGKILL);
}

}  // namespace tessera::ckpt
