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

// A new secret, or the reader key of the cluster's.
Result<std::string> Make(const SecretOptions& o) {
  if (!o.reader) return GenerateSecret();
  auto secret = LoadSecret(o.secret_file);
  if (!secret.ok()) return secret.status();
  if (IsReaderKey(*secret)) {
    return Status::InvalidArgument(
        "the secret given is a reader key already; --reader needs the cluster secret");
  }
  return ReaderKey(*secret);
}

int Run(const SecretOptions& o) {
  auto secret = Make(o);
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
  if (o.reader) {
    fprintf(stderr,
            "tessera secret: wrote the cluster's reader key to %s; give it to read-only "
            "clients (evaluators, inference readers) with TESSERA_SECRET_FILE=%s: it lets them "
            "pull, nothing else\n",
            o.out.c_str(), o.out.c_str());
    return 0;
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
  cmd->add_flag("--reader", options->reader,
                "derive the reader key of the cluster secret instead (read-only clients "
                "authenticate with it, and it lets them do nothing else)");
  cmd->add_option("--secret-file", options->secret_file,
                  "--reader: the cluster secret's file (default: TESSERA_SECRET, then "
                  "TESSERA_SECRET_FILE)");
  return [options] { return Run(*options); };
}

}  // namespace tessera::tools
