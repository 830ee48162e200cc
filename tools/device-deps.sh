#!/usr/bin/env bash
# Gathers what tools/device-check.sh needs on a GPU machine that has CUDA but
# no package registry and none of Tessera's -dev packages: Debian's .deb
# files (unpacked there into a private prefix, never into /) and, with
# --ucx-cu12, the CUDA-capable UCX from PyPI's libucx-cu12 wheel (its
# libraries and headers only). Everything lands in .devdeps/, which git
# ignores (.gitignore) and the device tool carries:
#
#   tools/device-deps.sh [--ucx-cu12]
#   device run: carry [".devdeps"], command "bash tools/device-check.sh"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.devdeps"
rm -rf "$out" && mkdir -p "$out/debs"

# Build dependencies (headers, static and shared libraries), their runtime
# libraries, and pkg-config itself.
packages=(libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 nlohmann-json3-dev libcli11-dev
          libssl-dev libssl3 libipsec-mb-dev libipsec-mb1 libucx-dev libucx0 libnuma1 libibverbs1 librdmacm1
          libnl-3-200 libnl-route-3-200 libgtest-dev pkgconf pkgconf-bin libpkgconf3)
(cd "$out/debs" && apt-get download "${packages[@]}" >/dev/null 2>&1) ||
  { echo "apt-get download failed (run apt-get update first?)" >&2; exit 1; }

if [[ "${1:-}" == "--ucx-cu12" ]]; then
  wheel_dir=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheel_dir" libucx-cu12
  # Shared libraries (not the 25 MB static ones), UCX's modules, headers.
  # (unzip's * also matches /: this takes lib/ucx/*.so* too)
  (cd "$wheel_dir" && unzip -q ./*.whl 'libucx/lib/*.so*' \
     'libucx/include/*' 'libucx/bin/ucx_info' -d "$out/ucx-cu12")
  rm -rf "$wheel_dir"
  # A wheel holds each library three times over (no symbolic links in zip
  # files): keep the soname's file, link the plain name to it.
  find "$out/ucx-cu12" -name '*.so.*.*.*' -delete
  for so in $(find "$out/ucx-cu12" -name '*.so.[0-9]'); do
    ln -sf "$(basename "$so")" "${so%.*}"
  done
fi
du -sh "$out"
