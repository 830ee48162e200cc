#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with an NVIDIA GPU (docs/gpu.md):
#
#   1. builds Tessera with CUDA (-Dcuda=enabled; verbs off, no benchmarks),
#      from the system's packages or, where they are missing, from the .deb
#      files tools/device-deps.sh put in .devdeps/ (unpacked into a private
#      prefix, never into /);
#   2. the CUDA kernels against the CPU's, bit for bit (kernels_cuda_test);
#   3. shards with parameters on the GPU against host shards, host staging,
#      GPU buffers, CUDA IPC between processes (gpu_shard_test);
#   4. each update kernel's bandwidth as a ratio of a device-to-device
#      cudaMemcpy of the same bytes (tessera-gpu-bench kernels);
#   5. Adam against PyTorch's fused Adam on the same tensors, where PyTorch is;
#   6. push/pull of GPU buffers over CUDA IPC against cudaMemcpy;
#   7. a checkpoint of GPU-resident parameters read by the safetensors package;
#   8. NodeGroup (NCCL) with one rank, and one rank per GPU where several;
#   9. with .devdeps/ucx-cu12 (tools/device-deps.sh --ucx-cu12): the same
#      shards over PyPI's CUDA-capable UCX, which reaches GPU memory itself.
#
# Writes device-check.log and device-check.json (every step's outcome and the
# measured figures) under $OUT, or ./device-check-out. Each step is bounded;
# a failed step is recorded and the rest still run. Exit 0 when none failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/device-check-out}
mkdir -p "$out"
exec > >(tee "$out/device-check.log") 2>&1
results="$out/steps.jsonl"
: > "$results"
build=/tmp/tessera-build-gpu
prefix=/tmp/tessera-prefix
jobs=$(nproc)
failed=0

# step NAME TIMEOUT_S CMD...: runs CMD, records its outcome (77 = skipped).
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local outcome=passed
  if [[ $rc == 77 ]]; then outcome=skipped; elif [[ $rc != 0 ]]; then outcome=failed; failed=1; fi
  [[ $rc == 124 || $rc == 137 ]] && outcome="failed (timed out after ${limit}s)"
  echo "=== $name: $outcome (rc $rc, $((SECONDS - start)) s)"
  printf '{"step": "%s", "outcome": "%s", "rc": %d, "seconds": %d}\n' \
    "$name" "$outcome" "$rc" "$((SECONDS - start))" >> "$results"
  return $rc
}

echo "=== machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
export PATH="$PATH:/usr/local/cuda/bin"
nvcc --version 2>&1 | tail -n 2 || echo "nvcc: not found"
c++ --version 2>&1 | head -n 1
python3 --version 2>&1
MESON="meson"
command -v meson > /dev/null || MESON="python3 -m mesonbuild.mesonmain"
export MESON
$MESON --version 2>&1 | sed 's/^/meson /'

# Dependencies: the system's, else (or with TESSERA_DEVICE_CHECK_CARRIED=1)
# the carried .deb files.
if [[ "${TESSERA_DEVICE_CHECK_CARRIED:-0}" == 1 ]] || ! { command -v pkg-config > /dev/null && pkg-config --exists ucx fmt spdlog nlohmann_json CLI11 gtest; }; then
  if ! ls "$root"/.devdeps/debs/*.deb > /dev/null 2>&1; then
    echo "missing build dependencies and no .devdeps/debs: run tools/device-deps.sh first"
    exit 2
  fi
  echo "=== unpacking $(ls "$root"/.devdeps/debs/*.deb | wc -l) carried packages into $prefix"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for deb in "$root"/.devdeps/debs/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  # The packages' .pc files name /usr: point them at the prefix.
  find "$prefix" -name '*.pc' -exec sed -i -E \
    "s#^(prefix|exec_prefix|libdir|includedir)([[:space:]]*)=([[:space:]]*)/usr#\1=$prefix/usr#" {} +
  multiarch="$prefix/usr/lib/x86_64-linux-gnu"
  export PATH="$prefix/usr/bin:$PATH"
  export PKG_CONFIG_PATH="$multiarch/pkgconfig:$prefix/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
  export LD_LIBRARY_PATH="$multiarch:${LD_LIBRARY_PATH:-}"
  export LIBRARY_PATH="$multiarch:${LIBRARY_PATH:-}"
  export UCX_MODULE_DIR="$multiarch/ucx"
fi

# build_tree DIR LOG [meson options] [-- ninja targets]
build_tree() {
  local dir=$1 log=$2
  shift 2
  local opts=() targets=()
  while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift && targets=("$@")
  rm -rf "$dir"
  # shellcheck disable=SC2086
  if ! $MESON setup "$dir" "$root" -Dcuda=enabled -Dverbs=disabled -Dbenchmarks=false \
      -Dwerror=false "${opts[@]}" > "$log" 2>&1; then
    tail -n 40 "$log"
    return 1
  fi
  ninja -C "$dir" -j "$jobs" "${targets[@]}"
}
export -f build_tree
export root jobs

# NCCL: CUDA's own, else PyTorch's (PyPI's nvidia-nccl), else none (the
# NodeGroup test is then not built, and the log says so).
nccl_opts=()
if [[ ! -e /usr/local/cuda/include/nccl.h && ! -e /usr/include/nccl.h ]]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [[ -n "$nccl_dir" && -e "$nccl_dir/include/nccl.h" ]]; then
    nccl_opts=(-Dnccl_prefix="$nccl_dir")
  else
    echo "=== no NCCL found: NodeGroup is built without it"
  fi
fi
export nccl_opts_str="${nccl_opts[*]:-}"

step build 420 bash -c 'build_tree "$0" "$1" $nccl_opts_str' "$build" "$out/meson-setup.log"
if [[ $? != 0 ]]; then
  echo "build failed: nothing else can run"
else
  export UCX_TLS=${UCX_TLS:-tcp}
  # Whether this machine's GPU is usable: without one every GPU case below
  # skips (the steps still pass), and the summary says why.
  gpu_state=$("$build/tools/tessera" doctor --json 2> /dev/null | python3 -c '
import json, sys
for f in json.load(sys.stdin):
    if f["check"] == "gpu-registration":
        print(f["data"].get("cuda", "?"))' 2> /dev/null || echo "tessera doctor failed")
  echo "=== GPU: $gpu_state"
  printf '{"step": "gpu", "outcome": "%s", "rc": 0, "seconds": 0}\n' \
    "$( [[ $gpu_state == ok ]] && echo usable || echo "not usable: ${gpu_state//\"/\'}")" >> "$results"
  step kernels-cuda-test 180 "$build/tests/kernels_cuda_test"
  step gpu-shard-test 400 env TESSERA_BIN="$build/tools/tessera" "$build/tests/gpu_shard_test"
  if [[ -x "$build/tests/node_group_test" ]]; then
    step node-group-test 300 "$build/tests/node_group_test"
  fi
  step transport-gpu-refusal 60 "$build/tests/transport_test" --gtest_filter='*Gpu*'
  step doctor 30 "$build/tools/tessera" doctor
  step kernels-vs-memcpy 240 bash -c "'$build/tools/tessera-gpu-bench' --iters 20 kernels > '$out/kernels.json'"
  step adam-vs-torch 240 bash -c "python3 '$root/tools/device_check/adam_vs_torch.py' \
      --bench '$build/tools/tessera-gpu-bench' > '$out/adam.json'"
  step ipc-push-pull 240 bash -c "'$build/tools/tessera-gpu-bench' --iters 10 ipc \
      --tessera '$build/tools/tessera' --bytes 268435456 > '$out/ipc.json'"
  if [[ $gpu_state == ok ]]; then
    step bench-gpu-buffers 300 "$build/tools/tessera" bench push pull --memory cuda --no-pin \
        --transport tcp --sizes 8,64K,16M,256M --iters 10 --warmup 2 --baseline --check \
        --json "$out/bench-gpu.json"
  fi
  if python3 -c "import pytest, safetensors, numpy" 2> /dev/null; then
    step safetensors-gpu-checkpoint 240 env TESSERA_BIN="$build/tools/tessera" \
        LINEAR_REGRESSION="$build/examples/linear_regression" \
        python3 -m pytest -q -p no:cacheprovider "$root/tests/python/test_safetensors_interop.py" \
        -k checkpoint_of_parameters
  else
    echo "=== safetensors-gpu-checkpoint: skipped: python3 lacks pytest, safetensors or numpy"
    printf '{"step": "safetensors-gpu-checkpoint", "outcome": "skipped", "rc": 77, "seconds": 0}\n' \
      >> "$results"
  fi

  ucx="$root/.devdeps/ucx-cu12/libucx"
  if [[ -d "$ucx" ]]; then
    build2=/tmp/tessera-build-gpu-ucx
    step build-ucx-cu12 420 bash -c 'build_tree "$0" "$1" -Ducx_prefix="$2" -- \
        tools/tessera tests/gpu_shard_test tests/transport_test' \
        "$build2" "$out/meson-setup-ucx.log" "$ucx"
    if [[ $? == 0 ]]; then
      # The wheel's UCX finds its modules beside itself.
      export UCX_MODULE_DIR="$ucx/lib/ucx"
      step doctor-ucx-cu12 30 "$build2/tools/tessera" doctor
      step gpu-shard-test-ucx-cu12 400 env UCX_TLS=tcp,cuda_copy,cuda_ipc \
          TESSERA_BIN="$build2/tools/tessera" "$build2/tests/gpu_shard_test"
    fi
  else
    echo "=== no .devdeps/ucx-cu12: the CUDA-capable UCX checks are not run"
    printf '{"step": "ucx-cu12", "outcome": "skipped", "rc": 77, "seconds": 0, "why": "%s"}\n' \
      "not carried (tools/device-deps.sh --ucx-cu12)" >> "$results"
  fi
fi

python3 - "$out" << 'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
summary = {"steps": [json.loads(l) for l in (out / "steps.jsonl").read_text().splitlines() if l]}
for name in ("kernels", "adam", "ipc", "bench-gpu"):
    f = out / f"{name}.json"
    if f.exists() and f.stat().st_size:
        try:
            summary[name] = json.loads(f.read_text())
        except ValueError as e:
            summary[name] = {"unreadable": str(e)}
(out / "device-check.json").write_text(json.dumps(summary, indent=2))
print(json.dumps({s["step"]: s["outcome"] for s in summary["steps"]}, indent=2))
PY
exit $failed
