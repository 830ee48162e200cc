#include "core/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

std::string Named(std::string_view what, const std::string& path) {
  return std::string(what) + " '" + path + "'";
}

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens `path` for reading when it is a regular file of at most `max_bytes`
// (O_NONBLOCK: opening a FIFO would wait for a writer); its size in *size.
Result<int> OpenRegular(const std::string& path, uint64_t max_bytes, std::string_view what,
                        uint64_t* size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return Status::NotFound("cannot read " + Named(what, path) + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Status::Unavailable("cannot read " + Named(what, path) + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return Status::InvalidArgument(Named(what, path) + " is " + KindOf(st.st_mode) +
                                   ", not a regular file: refused");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    close(fd);
    return Status::ResourceExhausted(Named(what, path) + " has " + std::to_string(st.st_size) +
                                     " bytes, over the " + std::to_string(max_bytes) +
                                     "-byte limit for it");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Reads up to `size` bytes (the file may have shrunk since; it may not
// grow past the bound: what is past it is not read).
template <typename Container>
Result<Container> ReadRegular(const std::string& path, uint64_t max_bytes, std::string_view what) {
  uint64_t size = 0;
  auto fd = OpenRegular(path, max_bytes, what, &size);
  if (!fd.ok()) return fd.status();
  Container out(static_cast<size_t>(size), 0);
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = read(*fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      close(*fd);
      return Status::Unavailable("reading " + Named(what, path) + ": " + std::strerror(err));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  close(*fd);
  out.resize(got);
  return out;
}

}  // namespace

Result<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes,
                                    std::string_view what) {
  return ReadRegular<std::string>(path, max_bytes, what);
}

Result<std::vector<uint8_t>> ReadBoundedFileBytes(const std::string& path, uint64_t max_bytes,
                                                  std::string_view what) {
  return ReadRegular<std::vector<uint8_t>>(path, max_bytes, what);
}

}  // namespace tessera
