#!/usr/bin/env bash
# deploy/k8s's manifests run as pods in network namespaces (k8s_sim.py): the
# ps StatefulSet and the workers' Indexed Job to exact sums; a Kubeflow
# TFJob (chief, worker, 2 ps, an evaluator holding only the reader key) as
# the training operator renders it; and a worker pod SIGKILLed in sync
# training; first, that deploy/docker/Dockerfile builds the images they
# name, with the files their commands run (images_check.py). Exit 77
# (skipped) where network namespaces cannot be made.
set -uo pipefail
: "${TESSERA_BIN:?}" "${INTEGRATION_WORKER:?}"
here=$(cd "$(dirname "$0")" && pwd)
# PyYAML: Debian's python3-yaml, for Debian's python3 (the first python3
# on PATH may be another).
py=python3
python3 -c 'import yaml' 2> /dev/null || py=/usr/bin/python3
if ! "$py" -c 'import yaml' 2> /dev/null; then
  echo "k8s: SKIPPED: no Python with PyYAML (Debian: python3-yaml)"
  exit 77
fi
rc=0
# The images the manifests name: deploy/docker/Dockerfile, read by
# BuildKit's parser (PyPI's dockerfile, in the project's .venv).
venv_py="$here/../../.venv/bin/python"
if "$venv_py" -c 'import dockerfile, yaml' 2> /dev/null; then
  echo "== k8s: images"
  "$venv_py" "$here/images_check.py" "$here/../.." || rc=1
else
  echo "== k8s: images: NOT CHECKED: no .venv with PyPI's dockerfile and PyYAML (tools/dev.sh makes it)"
  rc=1
fi
for scenario in plain tfjob kill; do
  echo "== k8s: $scenario"
  timeout 400 "$py" "$here/k8s_sim.py" --scenario "$scenario" "$here/../../deploy/k8s" \
    "$TESSERA_BIN" "$INTEGRATION_WORKER"
  status=$?
  [ $status -eq 77 ] && exit 77
  [ $status -eq 0 ] || rc=1
done
exit $rc
