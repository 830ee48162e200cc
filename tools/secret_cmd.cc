#include "tools/secret_cmd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/secret.h"

namespace tessera::tools {
namespace {

int Run(const SecretOptions& o) {
  auto secret = GenerateSecret();
  if (!secret.ok()) {
    fprintf(stderr, "tessera secret: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  if (o.out.empty()) {
    printf("%s\n", secret->c_str());
    return 0;
  }
  // Never readable by others, not even for a moment: created with 0600.
  const int flags = O_WRONLY | O_CREAT | (o.force ? O_TRUNC : O_EXCL) | O_CLOEXEC;
  const int fd = open(o.out.c_str(), flags, 0600);
  if (fd < 0) {
    fprintf(stderr, "tessera secret: cannot create %s: %s%s\n", o.out.c_str(), strerror(errno),
            errno == EEXIST ? " (--force replaces it)" : "");
    return 1;
  }
  const std::string line = *secret + "\n";
  const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                       fchmod(fd, 0600) == 0 && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!written) {
    fprintf(stderr, "tessera secret: writing %s failed: %s\n", o.out.c_str(), strerror(err));
    return 1;
  }
  fprintf(stderr,
          "tessera secret: wrote a new cluster secret to %s; give it to every task with "
          "TESSERA_SECRET_FILE=%s or --secret-file\n",
          o.out.c_str(), o.out.c_str());
  return 0;
}

}  // namespace

std::function<int()> AddSecretCommand(CLI::App* app, SecretOptions* options) {
  auto* cmd = app->add_subcommand(
      "secret", "make a cluster secret (32 random bytes, hex): printed, or written to a file");
  cmd->add_option("--out", options->out, "create this file (mode 0600) instead of printing");
  cmd->add_flag("--force", options->force, "replace --out if it exists");
  return [options] { return Run(*options); };
}

}  // namespace tessera::tools
