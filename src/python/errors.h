// Status -> Python exception: tessera.Error carries the Status text and its
// code name, so a Python caller sees exactly what the C++ caller would.
#pragma once

#include <nanobind/nanobind.h>

#include "tessera/status.h"

namespace tessera::python {

// Creates tessera._tessera.Error (a RuntimeError) in the module.
void RegisterErrors(nanobind::module_& m);

// Raises tessera.Error for a failed Status. Call with the GIL held.
void ThrowIfError(const Status& st);

// Whether a raised exception is tessera.Error (a call's failure), rather
// than one of Python's own (KeyboardInterrupt from a signal handler).
bool IsTesseraError(const nanobind::python_error& e);

template <typename T>
T ValueOrThrow(Result<T>&& r) {
  if (!r.ok()) ThrowIfError(r.status());
  return std::move(*r);
}

}  // namespace tessera::python
