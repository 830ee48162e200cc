#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (run as root):
#   tools/dev.sh demo   install what is missing, build, run `tessera demo`
#   tools/dev.sh test   install what is missing (Debian packages, among them
#                       qemu and a kernel for the Soft-RoCE VM, and Debian's
#                       torch; a .venv from PyPI for the Python package and
#                       its tests), build, run every test suite: the
#                       optimised build with the Python package; its launch,
#                       cluster, checkpoint and PyTorch-example tests and the
#                       VM's cluster runs again beside stress-ng on every
#                       core; everything again under ASan/UBSan; the unit
#                       and integration suites' UCX cases built against
#                       PyPI's CUDA-capable UCX (libucx-cu12), the UCX a GPU
#                       deployment would use; the fuzz targets (libFuzzer,
#                       clang, ASan/UBSan) for a bounded time each; the unit
#                       and integration suites under ThreadSanitizer;
#                       `pip install .` into
#                       a fresh venv and the package's tests against it
#                       (its command starting their cluster); last, the Soft-RoCE VM's
#                       runs of the optimised and ASan/UBSan builds.
#                       Each stage prints how long it took. The builds of
#                       the later stages run behind the earlier stages'
#                       tests, at the lowest CPU priority, through ccache
#                       (.cache/ccache), so that the second UCX's build
#                       compiles only what includes UCX; the sanitizer
#                       builds compile each layer as one unit.
#   tools/dev.sh pip    only `pip install .` and the Python package's tests
set -euo pipefail
cd "$(dirname "$0")/.."
# The CUDA toolkit (nvcc) where it is installed: the CUDA kernels, the GPU
# shard paths and NCCL's NodeGroup are then built (a toolkit that cannot build
# them fails the build instead of being skipped quietly), and their tests
# skip, saying why, where no GPU can be used.
GPU_OPTIONS=()
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
  GPU_OPTIONS=(-Dcuda=enabled)
  if [ -e /usr/local/cuda/include/nccl.h ]; then GPU_OPTIONS+=(-Dnccl=enabled); fi
fi

PACKAGES=(
  build-essential meson ninja-build pkg-config cmake ccache
  libucx-dev ucx-utils
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libibverbs-dev librdmacm-dev
  iproute2 procps
  python3 python3-venv python3-dev
)
# Intel IPsec-MB (Debian builds it for amd64 only): protected tcp sessions
# seal with it where the CPU has AES-NI, about 3x OpenSSL 3.0 with VAES
# (transport/tcp/gcm_engine.h); OpenSSL elsewhere.
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then PACKAGES+=(libipsec-mb-dev); fi
# The Python package's tests and its PyTorch example (docs/python.md):
# Debian's CPU-only torch and scikit-learn (whose digits the example trains
# on), seen from the project's venv (--system-site-packages). PyPI's default
# torch wheel would pull several GB of CUDA libraries into every CI run.
PY_DEB_PACKAGES=(python3-numpy python3-torch python3-sklearn)
# The engines tessera run is tested under (tests/engines): Open MPI, and
# Slurm with munge, started by the test itself; PyYAML to read the
# Kubernetes manifests; Java for Spark (pyspark comes from PyPI, in .venv).
ENGINE_PACKAGES=(openmpi-bin slurmctld slurmd slurm-client munge python3-yaml
  openjdk-17-jre-headless)
# A CPU hog on every core for the tests that must hold on a busy host.
LOAD_PACKAGES=(stress-ng)
# libFuzzer: clang and its runtimes; clang's Python binding, with which
# tools/code_shape.py reads the classes' and functions' sizes (unit suite).
FUZZ_PACKAGES=(clang libclang-rt-14-dev python3-clang-14)
# For the tests on a real kernel RDMA stack (tests/rdma-vm/run): Debian's
# kernel with Soft-RoCE, booted under qemu; rdma-core's tools and perftest.
VM_PACKAGES=(
  qemu-system-x86 linux-image-amd64 busybox-static kmod cpio
  rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
)

# Python tooling for the interoperability tests and the Python package, in
# the project's own venv (dockerfile: BuildKit's Dockerfile parser, for the
# check of deploy/docker). numpy stays 1.x: Debian's torch and scipy are
# built against it.
PY_PACKAGES=("safetensors>=0.4,<1" "numpy>=1.24,<2" "pytest>=7" "matplotlib>=3.6,<4"
  "nanobind>=2.4,<4" "pyspark>=3.5,<5" "dockerfile>=3.3,<4")

install_missing() {  # install_missing PACKAGE...
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Debian's own Python (the first python3 on PATH may be another), so that
# Debian's python3-* packages are seen.
python_env() {
  if ! .venv/bin/python -c "import safetensors, numpy, pytest, matplotlib, nanobind, torch, pyspark, dockerfile" \
    2>/dev/null; then
    echo "== creating .venv: ${PY_PACKAGES[*]}"
    rm -rf .venv
    /usr/bin/python3 -m venv --system-site-packages .venv
    .venv/bin/pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  fi
}

# `pip install .` into a fresh venv, as a user would (pyproject.toml,
# meson-python, nanobind from PyPI), then the package's suite against that
# installed copy instead of the build directory's, its cluster started by
# the wheel's own `tessera` command.
# (Each step's status is checked: a stage runs where set -e does not apply.)
pip_package() {
  pip_install "$@" && pip_test
}
pip_install() {
  rm -rf build-pip &&
    /usr/bin/python3 -m venv --system-site-packages build-pip/venv &&
    build-pip/venv/bin/pip install -q --disable-pip-version-check "pytest>=7" "numpy>=1.24,<2" &&
    build-pip/venv/bin/pip install -q --disable-pip-version-check . "$@"
}
pip_test() {
  (cd build-pip && venv/bin/python -c \
    "import tessera, sys; print('installed', tessera.__version__, 'at', tessera.__file__)") &&
  (cd build-pip && TESSERA_BIN=$PWD/venv/bin/tessera TESSERA_PYTHON=$PWD/venv/bin/python \
    TESSERA_PYTHONPATH="" TESSERA_TRANSPORTS=tcp ../tests/pypkg/run.sh)
}

# PyPI's UCX built with CUDA (libucx-cu12), in the venv; prints its prefix.
ucx_cu12_prefix() {
  if ! .venv/bin/python -c "import libucx" 2>/dev/null; then
    echo "== installing libucx-cu12 into .venv" >&2
    .venv/bin/pip install -q --disable-pip-version-check "libucx-cu12>=1.15,<2" >&2
  fi
  .venv/bin/python -c "import libucx, os; print(os.path.dirname(libucx.__file__))"
}

# The test command's builds, compiled through ccache (meson uses it when it
# is on PATH): the optimised build and the UCX 1.22 one differ only in what
# includes UCX's headers, and the rest of the second is taken from the
# first. The builds are sibling directories compiled with paths relative to
# them, so the directory is left out of the hash. Their debug information
# is line tables only (-g1): what a sanitizer's or a debugger's backtrace
# needs, at about four fifths of the optimised compile time of -g; the code
# is the same.
ci_build_env() {
  export CCACHE_DIR=${CCACHE_DIR:-$PWD/.cache/ccache} CCACHE_NOHASHDIR=true
  LINE_TABLES=(-Dc_args=-g1 -Dcpp_args=-g1)
}

build() {  # build DIR [meson options...]
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" || return
  fi
  ninja -C "$dir" ${NINJA_TARGETS:-}
}

# meson's summary as the plain closing line CI reads: "N passed, N failed".
run_suite() {  # run_suite DIR [meson test options...]
  local dir=$1 rc=0
  shift
  meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" || rc=$?
  local log="$dir/meson-logs/testlog.json" passed failed skipped
  passed=$(grep -c '"result": "OK"' "$log" || true)
  failed=$(grep -Ec '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
  skipped=$(grep -c '"result": "SKIP"' "$log" || true)
  echo "$dir: $passed passed, $failed failed, $skipped skipped"
  # Where a stage's time went, for whoever makes CI faster.
  /usr/bin/python3 -c 'import json, sys
tests = [json.loads(line) for line in open(sys.argv[1])]
tests.sort(key=lambda t: -t["duration"])
print("slowest: " + ", ".join("%s %.0f s" % (t["name"].split(" / ")[-1], t["duration"]) for t in tests[:6]))' \
    "$log" || true
  # CI shows the tail: the failed assertions last, where it is seen.
  if [ "$failed" != 0 ]; then /usr/bin/python3 tools/test_failures.py "$log" || true; fi
  return $rc
}

# Runs a stage and says how long it took, whether it passed or not.
stage() {  # stage NAME COMMAND...
  local name=$1 start=$SECONDS rc=0
  shift
  echo "== stage: $name"
  "$@" || rc=$?
  echo "== stage: $name: $((SECONDS - start)) s, exit $rc (total $((SECONDS - ci_start)) s)"
  return $rc
}

# A stage under the ASan/UBSan build's options: leaks reported, and the
# first undefined behaviour fatal, with its stack.
asan_stage() {  # asan_stage NAME COMMAND...
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 stage "$@"
}

# `pip install .` and the sanitizer and second-UCX builds, built in the
# background while the earlier stages test. Tests leave cores idle (they
# wait on peers, on timeouts), and a build at the lowest CPU priority
# (nice 19) takes mostly that idle time. Not so beside the Soft-RoCE VM,
# whose emulated CPUs slow down beside any neighbour: its runs come after
# the builds (below).
# Each build holds a lock while it runs (taken here, before the fork, so
# that no waiter can take it first) and writes build-logs/DIR.log and
# DIR.status (its seconds and exit status); wait_build shows them as a stage.
start_background_builds() {
  local dir lock
  mkdir -p build-logs
  for dir in build-pip build-asan build-fuzz build-tsan build-ucx-cu12; do
    rm -f "build-logs/$dir.status"
    exec {lock}>"build-logs/$dir.lock"
    flock -x "$lock"
    BUILD_LOCKS[$dir]=$lock
  done
  local ucx
  ucx=$(ucx_cu12_prefix)
  (
    renice -n 19 -p "$BASHPID" > /dev/null  # all of them, at the lowest priority
    one() {  # one DIR COMMAND...: runs it, then lets DIR's waiter in
      local dir=$1 start=$SECONDS rc=0
      shift
      "$@" > "build-logs/$dir.log" 2>&1 || rc=$?
      # How much ccache served, all builds so far together.
      ccache --show-stats >> "build-logs/$dir.log" 2>&1 || true
      echo "$((SECONDS - start)) $rc" > "build-logs/$dir.status"
      eval "exec ${BUILD_LOCKS[$dir]}>&-"
    }
    meson_build() { build "$@" "${LINE_TABLES[@]}"; }
    # In the order the stages need them. (The hog's stage starves them all.)
    # The sanitizer builds leave the Python package out: an instrumented
    # extension cannot load into Debian's uninstrumented python3 without
    # preloading the sanitizer runtime into the interpreter.
    # The sanitizer builds compile each layer's library as one translation
    # unit (-Dunity_layers): a quarter of the compile time, measured on the
    # server's sources under TSan. The optimised build above and UCX 1.22's
    # compile file by file, so a source missing an include still fails.
    one build-asan meson_build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug \
      -Dunity_layers=true -Dpython=disabled -Dbenchmarks=false "${GPU_OPTIONS[@]}"
    # UCX 1.22's: file by file as the optimised build, so mostly ccache's
    # hits; its tests come next, while TSan's builds.
    one build-ucx-cu12 meson_build build-ucx-cu12 -Ducx_prefix="$ucx" -Dpython=disabled -Dbenchmarks=false \
      "${GPU_OPTIONS[@]}"
    # Only the fuzz targets and what they link.
    CC=clang CXX=clang++ NINJA_TARGETS=fuzzers one build-fuzz meson_build build-fuzz -Dfuzzers=true \
      -Dfuzz_seconds=40 -Dunity_layers=true \
      -Db_sanitize=address,undefined -Db_lundef=false -Dpython=disabled -Dcuda=disabled \
      -Dnccl=disabled -Dverbs=disabled -Dbenchmarks=false
    # The CUDA code is left out of TSan's: it cannot run here, and nvcc's
    # host code is not TSan's to check.
    one build-tsan meson_build build-tsan -Db_sanitize=thread -Db_lundef=false -Dpython=disabled -Dcuda=disabled \
      -Dnccl=disabled -Dbenchmarks=false -Dunity_layers=true
    # `pip install .` as a user runs it (its own meson build, release, in a
    # temporary directory): nothing of it is in the cache.
    CCACHE_DISABLE=1 one build-pip pip_install
  ) &
  BACKGROUND_BUILDS=$!
  # A stage that fails ends the run: the builds behind it end with it.
  trap 'stop_background_builds' EXIT
  local dirs=("${!BUILD_LOCKS[@]}")
  for dir in "${dirs[@]}"; do eval "exec ${BUILD_LOCKS[$dir]}>&-"; done
}

kill_tree() {  # kill_tree PID: it and every process below it
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}

stop_background_builds() {
  if [ -n "${BACKGROUND_BUILDS:-}" ] && kill -0 "$BACKGROUND_BUILDS" 2>/dev/null; then
    kill_tree "$BACKGROUND_BUILDS"
  fi
}

wait_build() {  # wait_build DIR: waits for its background build; fails if it did
  local dir=$1 took rc
  flock -s "build-logs/$dir.lock" true
  cat "build-logs/$dir.log" 2>/dev/null || true
  if [ ! -f "build-logs/$dir.status" ]; then
    echo "== the background build of $dir ended without a status (killed?)"
    return 1
  fi
  read -r took rc < "build-logs/$dir.status"
  echo "== $dir: built in the background at nice 19 in $took s, exit $rc"
  return "$rc"
}

# The suites that must hold on a busy host, beside stress-ng on every core:
# a training host is never idle, and neither is every CI machine.
under_load() {  # under_load DIR
  local dir=$1 rc=0
  stress-ng --cpu "$(nproc)" --timeout 3600s --quiet &
  local hog=$!
  TESSERA_VM_ONLY=cluster run_suite "$dir" launch cluster checkpoint torch-example rdma-vm || rc=$?
  kill "$hog" 2>/dev/null
  wait "$hog" 2>/dev/null || true
  return $rc
}

ci_start=$SECONDS
# The launch cases that train the same processes again over another network
# (network namespaces, a throttled link, UCX's tcp, a coordinator task of its
# own), left out of the sanitizer runs: the cluster suite runs their code
# in-process there.
SAME_TRAINING_AGAIN='-NetnsTest.*:*TwoShardsThreeWorkersExactSums/tcp:LaunchTest.SeparateCoordinatorTask'
case "${1:-}" in
  demo)
    install_missing "${PACKAGES[@]}"
    build build "${GPU_OPTIONS[@]}"
    exec build/tools/tessera demo "${@:2}"
    ;;
  pip)
    # tools/dev.sh pip: only the Python package stage (pip install . and its suite).
    install_missing "${PACKAGES[@]}" "${PY_DEB_PACKAGES[@]}"
    stage "python package: pip install ." pip_package
    ;;
  test)
    stage "packages" install_missing "${PACKAGES[@]}" "${VM_PACKAGES[@]}" "${LOAD_PACKAGES[@]}" \
      "${FUZZ_PACKAGES[@]}" "${PY_DEB_PACKAGES[@]}" "${ENGINE_PACKAGES[@]}"
    stage "python venv" python_env
    ci_build_env
    # The Python package too (python/tessera), for the Python that has
    # nanobind: the venv's.
    stage "build" build build "${GPU_OPTIONS[@]}" -Dpython=enabled \
      -Dpython_installation="$PWD/.venv/bin/python" "${LINE_TABLES[@]}"
    # The later stages' builds go on behind the tests from here (above).
    declare -A BUILD_LOCKS
    start_background_builds
    # The Soft-RoCE VM runs at the end, alone (below).
    stage "tests" run_suite build --no-suite rdma-vm
    stage "tests beside a CPU hog" under_load build
    stage "build: ASan/UBSan" wait_build build-asan
    # The Soft-RoCE VM's ASan run waits for the end (below). Of the launch
    # suite, as under TSan (below), the launcher's own cases run, not those
    # that train the same processes again over another network (network
    # namespaces, a throttled link, UCX's tcp, a coordinator task of its own):
    # their code is the cluster suite's, which runs here in-process.
    GTEST_FILTER="$SAME_TRAINING_AGAIN" asan_stage "tests: ASan/UBSan" run_suite build-asan \
      --no-suite rdma-vm --no-rebuild
    # The same code against another UCX (1.22, with CUDA modules; no GPU
    # here, so it reports host memory and the GPU tests skip saying so).
    # Only what UCX carries: the engines' jobs, the cases of Tessera's own
    # sockets (*/native_tcp, its protected cases too), the checkpoint suite
    # (its clusters run on those sockets: tests/cluster_fixture.h) and the
    # docs' commands (Tessera's tcp, the default) never load a UCX
    # transport (strace: no UCX transport module opened), and ran above.
    stage "build: UCX 1.22" wait_build build-ucx-cu12
    GTEST_FILTER='-*/native_tcp*:CheckpointTest.*:*/CheckpointCrashTest.*' \
      stage "tests: UCX 1.22" run_suite build-ucx-cu12 \
      --suite unit --suite integration --no-suite engines --no-suite docs --no-rebuild
    # Every decoder of bytes from a peer or a file, fuzzed from its seed
    # corpus (tests/fuzz) for a bounded time.
    stage "build: fuzzers" wait_build build-fuzz
    stage "fuzz" run_suite build-fuzz --suite fuzz --no-rebuild -v
    # ThreadSanitizer over the unit and integration suites. UCX's memory
    # hooks (libucm) are off: they intercept madvise when a thread exits,
    # after TSan has torn down that thread's state, and crash there.
    # The engines' jobs are left out: what they add to the other suites is
    # each engine's variables and host lists, run by one thread; the threads
    # of `tessera run` (its rendezvous served on a thread while rank 0 joins)
    # are the rendezvous suite's, which TSan runs. Of the launch suite, the
    # launcher's own cases run (a failing worker, restarts, an interrupt, a
    # coordinator of its own, training on shm), not those that train the
    # same processes again over another network (network namespaces, a
    # throttled link, tcp, a separate coordinator task: 90 s of its 126 s
    # under TSan), whose code the cluster suite runs under TSan in-process.
    stage "build: TSan" wait_build build-tsan
    UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      GTEST_FILTER="$SAME_TRAINING_AGAIN" \
      stage "tests: TSan" run_suite build-tsan --suite unit --suite integration \
      --no-suite engines --no-rebuild
    # pip install . into a fresh venv (built behind the tests, above), and
    # the package's suite against it.
    stage "build: python package (pip install .)" wait_build build-pip
    stage "python package: its tests" pip_test
    # The Soft-RoCE VM last, the optimised build and then the ASan/UBSan one:
    # the background builds are done by now. Beside one, even at nice 19,
    # the optimised run took 474 s instead of about 200 s on 2 cores, and
    # the ASan one 465 s instead of 199 s: emulation suffers from any
    # neighbour. (The VM boots in about 5 s, so each run boots its own.)
    stage "tests: the Soft-RoCE VM" run_suite build --suite rdma-vm --no-rebuild
    # Under ASan and emulation its integration runs 40 tensors instead of
    # 200, with longer steps, and leaves out what adds no instrumented code
    # of Tessera's (tests/rdma_vm_suite.sh says which; the optimised run
    # above runs them).
    TESSERA_VM_WORKER_ARGS="--tensors 40 --big-mib 2" TESSERA_VM_STEP_TIMEOUT=600 \
      TESSERA_VM_SANITIZED=1 \
      asan_stage "tests: ASan/UBSan in the Soft-RoCE VM" run_suite build-asan --suite rdma-vm \
      --no-rebuild
    echo "== all stages passed in $((SECONDS - ci_start)) s"
    ;;
  *)
    echo "usage: tools/dev.sh demo|test|pip" >&2
    exit 2
    ;;
esac
