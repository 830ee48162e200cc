#include "tools/checkpoint_key_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ckpt/safetensors.h"
#include "core/secret.h"

namespace tessera::tools {
namespace fs = std::filesystem;

namespace {

Result<std::string> KeyDirectory() {
  std::string base;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg == '/') {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    base = std::string(home) + "/.config";
  } else {
    return Status::FailedPrecondition("neither XDG_CONFIG_HOME nor HOME names a directory");
  }
  const std::string dir = base + "/tessera/checkpoint-keys";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::FailedPrecondition("creating " + dir + ": " + ec.message());
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  return dir;
}

}  // namespace

Result<std::string> KeptCheckpointKeyFile(const std::string& dir) {
  auto keys = KeyDirectory();
  if (!keys.ok()) return keys.status();
  std::error_code ec;
  const std::string canonical = fs::weakly_canonical(fs::absolute(dir), ec).string();
  const std::string id =
      ckpt::Sha256Hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(canonical.data()),
                                               canonical.size()))
          .substr(0, 32);
  const std::string path = *keys + "/" + id;
  if (fs::exists(path, ec)) return path;  // kept from an earlier run
  // Written whole under another name, then linked into place: a launch
  // beside this one finds either no key or the whole of one.
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FailedPrecondition("creating " + tmp + ": " + std::strerror(errno));
  auto key = GenerateSecret();
  const std::string text = key.ok() ? *key + "\n" : std::string();
  const bool written = key.ok() &&
                       write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       fsync(fd) == 0;
  close(fd);
  const bool linked = written && (link(tmp.c_str(), path.c_str()) == 0 || errno == EEXIST);
  const int link_errno = errno;
  unlink(tmp.c_str());
  if (!key.ok()) return key.status();
  if (!linked) {
    return Status::FailedPrecondition("writing " + path + ": " + std::strerror(link_errno));
  }
  return path;
}

}  // namespace tessera::tools
