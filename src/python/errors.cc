#include "python/errors.h"

#include <string>

namespace nb = nanobind;

namespace tessera::python {
namespace {

// Owned by the module (m.attr("Error")), which outlives every call.
PyObject* g_error_type = nullptr;

}  // namespace

void RegisterErrors(nb::module_& m) {
  g_error_type = PyErr_NewExceptionWithDoc(
      "tessera.Error",
      "A Tessera call failed. str(e) is the Status text; e.code its code name "
      "(e.g. 'InvalidArgument', 'DeadlineExceeded', 'Unavailable').",
      PyExc_RuntimeError, nullptr);
  if (g_error_type == nullptr) throw nb::python_error();
  m.attr("Error") = nb::steal(g_error_type);
}

void ThrowIfError(const Status& st) {
  if (st.ok()) return;
  nb::object type = nb::borrow(g_error_type);
  const std::string text = st.ToString();
  nb::object error = type(text.c_str());
  error.attr("code") = StatusCodeName(st.code());
  PyErr_SetObject(g_error_type, error.ptr());
  throw nb::python_error();
}

bool IsTesseraError(const nanobind::python_error& e) { return e.matches(g_error_type); }

}  // namespace tessera::python
