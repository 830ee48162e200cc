# Sourced by the tests that run the Python package (tests/pypkg/run.sh,
# tests/torch_example.sh): skips (exit 77, meson's skip) saying why when the
# build has no Python package or its Python lacks a module, then puts the
# package on PYTHONPATH (TESSERA_PYTHONPATH: the build directory's python/,
# or empty for an installed package).
require_python_modules() {  # require_python_modules MODULE...
  if [ -z "${TESSERA_PYTHON:-}" ]; then
    echo "SKIP: built without the Python package (-Dpython; it needs nanobind, see docs/python.md)"
    exit 77
  fi
  local imports
  imports=$(IFS=,; echo "$*")
  if ! "$TESSERA_PYTHON" -c "import $imports" 2>/dev/null; then
    echo "SKIP: $TESSERA_PYTHON lacks one of $* (tools/dev.sh test installs them)"
    exit 77
  fi
  export PYTHONPATH="${TESSERA_PYTHONPATH:-}${PYTHONPATH:+:$PYTHONPATH}"
}
