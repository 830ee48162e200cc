#!/usr/bin/env bash
# Runs the Python interoperability tests with the project's virtual
# environment (tools/dev.sh makes it); exit 77 tells meson it skipped.
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/../../.venv"
if ! "$venv/bin/python" -c "import safetensors, numpy, pytest" 2>/dev/null; then
  echo "SKIP: no .venv with safetensors, numpy and pytest (tools/dev.sh test creates it)"
  exit 77
fi
cd "$here" && exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here"
