// The coordinator's state, embedded in shard 0: where every tensor lives
// (decided once, so workers agree whatever order they declare in) and whether
// the chief has initialised the parameters.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/placement.h"
#include "tessera/cluster.h"
#include "wire/messages.h"

namespace tessera::coord {

class Coordinator {
 public:
  explicit Coordinator(int num_shards) : num_shards_(num_shards) {}

  // Places new tensors and returns every tensor's chunks; `who` names the
  // declaring task in errors. All-or-nothing.
  Result<wire::DeclareReply> Declare(const wire::Declare& msg, const std::string& who);

  void MarkInitialized() { initialized_ = true; }
  bool initialized() const { return initialized_; }

 private:
  struct Placed {
    wire::TensorDecl decl;
    std::string declared_by;
    std::vector<wire::ChunkPlacement> chunks;
  };

  int num_shards_;
  std::unique_ptr<Placer> placer_;  // made on the first declare (its policy wins)
  std::map<std::string, Placed> tensors_;
  bool initialized_ = false;
};

}  // namespace tessera::coord
