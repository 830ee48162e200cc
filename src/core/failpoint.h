// A test hook for failures that cannot be provoked from outside: with
// TESSERA_FAIL_AT=NAME or NAME:N in the environment when a FailPoint named
// NAME is made, its Nth Check (the first by default) fails with an injected
// error, and every other Check passes. Without it a Check is one branch.
// (Crashes at a point are ckpt::CrashPoint's job.)
#pragma once

#include <cstdint>
#include <string>

#include "tessera/status.h"

namespace tessera {

class FailPoint {
 public:
  explicit FailPoint(const char* name);

  Status Check() {
    if (fail_at_ == 0 || ++reached_ != fail_at_) return Status::Ok();
    return Injected();
  }
  // Whether TESSERA_FAIL_AT named it: a loop on the hot path asks this
  // first, and makes no Status per turn otherwise.
  bool armed() const { return fail_at_ != 0; }

 private:
  Status Injected() const;

  std::string name_;
  uint64_t fail_at_ = 0;  // 0: never
  uint64_t reached_ = 0;
};

}  // namespace tessera
