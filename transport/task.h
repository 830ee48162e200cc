// Work posted to a progress thread (Context::Post, EventLoop::Post).
#pragma once

#include "core/inline_function.h"

namespace tessera::transport {

// Held in place: a client posts one per call, which then costs no
// allocation. 136 bytes hold a call's fan-out (its future, its parts and
// what issues them) and a backend's posted put or get (its endpoint, the
// operation and its Completion); larger work still posts, from the heap.
using Task = InlineFunction<void(), 136>;

}  // namespace tessera::transport
