// tessera._tessera.Server: a ps task inside a Python process (tessera.spark
// runs one in each of its ps tasks).
#pragma once

#include <nanobind/nanobind.h>

namespace tessera::python {

void BindServer(nanobind::module_& m);

}  // namespace tessera::python
