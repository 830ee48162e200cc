// Work posted to a progress thread (Context::Post, EventLoop::Post).
#pragma once

#include "core/inline_function.h"

namespace tessera::transport {

// Held in place: a client posts one per call, which then costs no
// allocation. 112 bytes hold a call's fan-out (its future, its parts and
// what issues them); larger work still posts, from the heap.
using Task = InlineFunction<void(), 112>;

}  // namespace tessera::transport
