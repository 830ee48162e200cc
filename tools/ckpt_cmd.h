// `tessera ckpt ls|inspect|verify`: look into checkpoint files.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace tessera::tools {

struct CkptOptions {
  std::vector<std::string> paths;
  bool json = false;
  bool accept_legacy = false;  // verify, ls: open version-1 manifests too
};

// Adds the `ckpt` subcommand with its own subcommands to `app`; the returned
// function runs whichever was chosen (after parsing).
std::function<int()> AddCkptCommand(CLI::App* app, CkptOptions* options);

}  // namespace tessera::tools
