// The Python classes over tessera::Client: Client, Tensor, Future, wait_all.
#pragma once

#include <nanobind/nanobind.h>

namespace tessera::python {

void BindClient(nanobind::module_& m);

}  // namespace tessera::python
