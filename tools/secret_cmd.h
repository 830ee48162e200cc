// `tessera secret`: makes a cluster secret, printed or written to a file
// only its owner may read.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace tessera::tools {

struct SecretOptions {
  std::string out;  // a file to create (mode 0600); empty: print it
  bool force = false;
};

std::function<int()> AddSecretCommand(CLI::App* app, SecretOptions* options);

}  // namespace tessera::tools
