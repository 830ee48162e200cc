// `tessera doctor`: checks the set-up problems users of RDMA parameter servers
// hit most, and says for each what is wrong and how to fix it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "tessera/server.h"

namespace tessera::tools {

struct DoctorOptions {
  bool json = false;
  // What the locked-memory check sizes: a shard's parameters plus one
  // staging slot per worker.
  double params_mib = 1024;
  // The server's own default (ServerOptions::staging_bytes_per_worker).
  double staging_mib = static_cast<double>(ServerOptions{}.staging_bytes_per_worker >> 20);
  int workers = 8;
  std::string cluster_file;  // else TF_CONFIG, if set: which address each task uses
};

// Adds the `doctor` subcommand; the returned function runs it.
std::function<int()> AddDoctorCommand(CLI::App* app, DoctorOptions* options);

}  // namespace tessera::tools
