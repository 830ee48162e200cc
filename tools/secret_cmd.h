// `tessera secret`: makes a cluster secret, or (--reader) derives the
// reader key of one, printed or written to a file only its owner may read.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace tessera::tools {

struct SecretOptions {
  std::string out;  // a file to create (mode 0600); empty: print it
  bool force = false;
  // The reader key of the cluster secret (--secret-file, else
  // TESSERA_SECRET or TESSERA_SECRET_FILE) instead of a new secret.
  bool reader = false;
  std::string secret_file;
};

std::function<int()> AddSecretCommand(CLI::App* app, SecretOptions* options);

}  // namespace tessera::tools
