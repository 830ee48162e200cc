#!/usr/bin/env bash
# tessera.spark on a real Spark in local mode (tests/spark/spark_test.py).
# Exit 77 (skipped) without the Python package, torch, pyspark or Java.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../pypkg/python_env.sh
. "$here/../pypkg/python_env.sh"
require_python_modules pytest numpy torch sklearn pyspark
if ! command -v java > /dev/null; then
  echo "spark: SKIPPED: no Java (Debian: openjdk-17-jre-headless)"
  exit 77
fi
exec "$TESSERA_PYTHON" -m pytest -q -p no:cacheprovider -x -rs "$here/spark_test.py" -s
