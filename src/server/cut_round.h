// A checkpoint round's write as the tables fill it (server/table.h): what
// the round names, and the bytes each of its entries had at the round's cut,
// copied out of the shard's memory for the writer thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "wire/messages.h"

namespace tessera::server {

struct CutRound {
  uint64_t round = 0;
  uint64_t step = 0;  // the sync step the cut is taken at
  std::string dir;
  std::vector<std::string> files;
  std::vector<wire::CkptEntry> entries;
  std::vector<ckpt::Piece> pieces;  // per entry: where it goes, and its bytes
  // Per parameter entry, in the entries' order: the updates its value had.
  std::vector<uint64_t> updates;
};

}  // namespace tessera::server
