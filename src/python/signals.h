// How the binding's blocking waits answer Ctrl-C: they wait without the GIL
// in short slices and run Python's signal handlers between them.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>

namespace tessera::python {

// How long a wait goes without the GIL before it takes it to run Python's
// signal handlers: Ctrl-C (KeyboardInterrupt) is answered within this,
// whatever the call waits for. Short calls complete within the first slice.
constexpr std::chrono::milliseconds kSignalSlice{20};

// Runs Python's signal handlers (with the GIL held): a handler's exception
// (KeyboardInterrupt) is thrown as nanobind::python_error.
inline void RunSignalHandlers() {
  if (PyErr_CheckSignals() != 0) throw nanobind::python_error();
}

}  // namespace tessera::python
