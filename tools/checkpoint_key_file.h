// Where `tessera launch` keeps a checkpoint directory's key across runs: each
// run makes a new cluster secret, and a key derived from it would leave the
// previous run's checkpoints unreadable (docs/training.md).
#pragma once

#include <string>

#include "tessera/status.h"

namespace tessera::tools {

// The key file for checkpoint directory `dir`, made (32 random bytes, hex,
// mode 0600) the first time:
// ${XDG_CONFIG_HOME:-$HOME/.config}/tessera/checkpoint-keys/<hash of dir's path>.
Result<std::string> KeptCheckpointKeyFile(const std::string& dir);

}  // namespace tessera::tools
