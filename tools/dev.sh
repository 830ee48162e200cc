#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (run as root):
#   tools/dev.sh demo   install what is missing, build, run `tessera demo`
#   tools/dev.sh test   install what is missing, build, run every test suite
#                       (the release-ish build, then again under ASan/UBSan)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential meson ninja-build pkg-config
  libucx-dev ucx-utils
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libibverbs-dev librdmacm-dev
  iproute2 procps
)

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
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

build() {  # build DIR [meson options...]
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@"
  fi
  ninja -C "$dir"
}

# meson's summary as the plain closing line CI reads: "N passed, N failed".
run_suite() {  # run_suite DIR
  local dir=$1 rc=0
  meson test -C "$dir" --print-errorlogs --num-processes 2 || rc=$?
  local log="$dir/meson-logs/testlog.json" passed failed skipped
  passed=$(grep -c '"result": "OK"' "$log" || true)
  failed=$(grep -Ec '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
  skipped=$(grep -c '"result": "SKIP"' "$log" || true)
  echo "$dir: $passed passed, $failed failed, $skipped skipped"
  return $rc
}

case "${1:-}" in
  demo)
    install_missing
    build build
    exec build/tools/tessera demo "${@:2}"
    ;;
  test)
    install_missing
    build build
    run_suite build
    build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_suite build-asan
    ;;
  *)
    echo "usage: tools/dev.sh demo|test" >&2
    exit 2
    ;;
esac
