// Ordering a call on a caller's CUDA stream without synchronising the host:
//
//   stream:  ... backward kernels | host call: start the push | wait: flag set | next kernels
//
// The start is a host function on the stream (cudaLaunchHostFunc), which
// runs once the work before it is done and hands the call to the client's
// progress thread. The end is a wait on a 32-bit flag in pinned host memory
// (cuStreamWaitValue32), which the client sets once the call completed, so
// the work enqueued after the call runs after its bytes landed. No thread
// of the caller's, and no CUDA callback thread, ever blocks.
//
// The flags are a process-wide pool that is never freed: a stream may still
// be waiting on a flag (already set) when the client that used it is gone.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "tessera/status.h"

namespace tessera::gpu {

// Runs `fn` once the work enqueued on `stream` (a cudaStream_t) before now
// is done. It runs on a CUDA thread: it must not call CUDA, nor block.
Status EnqueueHostCall(void* stream, std::function<void()> fn);

// A flag `stream` waits for: the work enqueued on the stream after Enqueue
// runs once Set was called. Move-only; set once. A flag never set keeps the
// stream waiting forever, so every path of the call that holds one sets it.
class StreamFlag {
 public:
  StreamFlag() = default;
  // Takes a flag from the pool; an error says why this process cannot
  // order calls on streams (no CUDA, no GPU, a driver without stream
  // memory operations).
  static Result<StreamFlag> Take();
  // Enqueues the stream's wait for this flag.
  Status EnqueueWait(void* stream);
  StreamFlag(StreamFlag&& other) noexcept { *this = std::move(other); }
  StreamFlag& operator=(StreamFlag&& other) noexcept;
  StreamFlag(const StreamFlag&) = delete;
  StreamFlag& operator=(const StreamFlag&) = delete;
  // Sets it, if it was not already (a flag destroyed unset is set then).
  ~StreamFlag() { Set(); }

  // Lets the stream go on, and returns the flag to the pool (any thread).
  void Set();

 private:
  int slot_ = -1;
  uint32_t value_ = 0;
  uint64_t device_address_ = 0;
};

}  // namespace tessera::gpu
