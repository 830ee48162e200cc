#!/usr/bin/env bash
# Installs the build into a staging prefix (meson install --destdir), checks
# what was installed, then builds trainer.cc outside the source tree three
# ways, as users would: through pkg-config (a meson project), through
# find_package (a CMake project, Debian's cmake) and statically (pkg-config
# --static and libtessera.a). Each runs as both workers of a real cluster of
# 2 ps tasks started by the staged `tessera launch`.
set -euo pipefail
: "${BUILD_ROOT:?}"
if [ "${SANITIZE:-none}" != none ]; then
  # The consumers would need the sanitizer runtime the library was built with.
  echo "SKIP: the build uses -fsanitize=$SANITIZE; the install test runs in the plain build"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/stage

echo "== meson install --destdir"
meson install -C "$BUILD_ROOT" --destdir "$stage" --no-rebuild --quiet
pc=$(find "$stage" -name tessera.pc)
libdir=$(dirname "$(dirname "${pc#"$stage"}")")
prefix=$(cd "$stage" && find . -path '*/bin/tessera' | sed 's|^\.||; s|/bin/tessera$||')
[ -n "$prefix" ] || { echo "FAIL: no bin/tessera installed"; exit 1; }
for f in "$prefix/include/tessera/client.h" "$prefix/include/tessera/c.h" \
         "$libdir/libtessera.so" "$libdir/libtessera.a" "$libdir/cmake/Tessera/TesseraConfig.cmake" \
         "$libdir/cmake/Tessera/TesseraConfigVersion.cmake"; do
  [ -e "$stage$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
soname=$(readelf -d "$stage$libdir/libtessera.so")
echo "$soname" | grep -q 'SONAME.*\[libtessera\.so\.0\]' || { echo "FAIL: no SONAME libtessera.so.0"; exit 1; }
[ -L "$stage$libdir/libtessera.so" ] || { echo "FAIL: libtessera.so is not a link to the versioned file"; exit 1; }

echo "== the public headers name no dependency's types"
if grep -nE '#\s*include\s*[<"](ucp|uct|ucs|fmt|spdlog|cuda|nccl|infiniband|rdma|nlohmann|openssl)' \
     "$stage$prefix/include/tessera/"*.h; then
  echo "FAIL: an installed header includes a dependency"; exit 1
fi
if grep -nE '#\s*include\s*"' "$stage$prefix/include/tessera/"*.h | grep -v '"tessera/'; then
  echo "FAIL: an installed header includes a header that is not installed"; exit 1
fi

echo "== libtessera.so exports the public API only"
strays=$(nm -D --defined-only "$stage$libdir/libtessera.so" | c++filt | awk '{ $1 = ""; $2 = ""; sub(/^  /, ""); print }' |
  grep -vE '^(tessera::|tessera_|typeinfo for tessera::|typeinfo name for tessera::|vtable for tessera::|TESSERA_0$)' || true)
if [ -n "$strays" ]; then
  echo "FAIL: exported beyond the public API:"; echo "$strays" | head -20; exit 1
fi
echo "$(nm -D --defined-only "$stage$libdir/libtessera.so" | wc -l) symbols, all tessera:: or tessera_*"

export PKG_CONFIG_PATH=$stage$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
export LD_LIBRARY_PATH=$stage$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tessera=$stage$prefix/bin/tessera

run_cluster() {  # run_cluster NAME TRAINER
  echo "== $1: 2 ps tasks, 2 workers"
  out=$("$tessera" launch --ps 2 --workers 2 --transport tcp -- "$2" 2>&1) || {
    echo "$out"; echo "FAIL: $1"; exit 1; }
  n=$(echo "$out" | grep -c 'w = 9 after 3 steps over 2 ps tasks' || true)
  [ "$n" -eq 2 ] || { echo "$out"; echo "FAIL: $1: $n of 2 workers reported the exact sums"; exit 1; }
  echo "$out" | grep 'trainer:'
}

echo "== a meson project, through pkg-config"
mkdir -p "$work/meson-src"
cp "$here/meson-consumer/meson.build" "$here/trainer.cc" "$work/meson-src/"
meson setup "$work/meson-build" "$work/meson-src" >"$work/meson-setup.log" 2>&1 ||
  { cat "$work/meson-setup.log"; exit 1; }
ninja -C "$work/meson-build" >/dev/null
# Each tool's whole output first, then the checks: under pipefail, `tool |
# grep -q` fails whenever grep's early exit cuts the tool off (SIGPIPE),
# which ldd, writing line by line, did now and then.
needed=$(readelf -d "$work/meson-build/trainer" | grep NEEDED)
grep -qE 'libtessera\.so\.0' <<< "$needed" ||
  { echo "FAIL: the meson trainer does not need libtessera.so.0"; exit 1; }
if grep -E 'libuc[pts]|libfmt|libspdlog|libcuda' <<< "$needed"; then
  echo "FAIL: the meson trainer links a dependency Tessera should keep private"; exit 1
fi
loaded=$(ldd "$work/meson-build/trainer")
grep -q "$stage.*libtessera" <<< "$loaded" ||
  { echo "$loaded"; echo "FAIL: the trainer did not load the staged libtessera"; exit 1; }
run_cluster "meson trainer" "$work/meson-build/trainer"

echo "== a CMake project, through find_package(Tessera)"
mkdir -p "$work/cmake-src"
cp "$here/cmake-consumer/CMakeLists.txt" "$here/trainer.cc" "$work/cmake-src/"
cmake -S "$work/cmake-src" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$stage$prefix" \
  -DCMAKE_CXX_FLAGS=-Werror >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake-build" >/dev/null
run_cluster "CMake trainer" "$work/cmake-build/trainer"

echo "== statically, through pkg-config --static"
# shellcheck disable=SC2046
g++ -std=c++20 -O1 -o "$work/trainer-static" "$here/trainer.cc" \
  $(pkg-config --cflags tessera) \
  $(pkg-config --static --libs tessera | sed 's/-ltessera\b/-l:libtessera.a/')
if readelf -d "$work/trainer-static" | grep NEEDED | grep libtessera; then
  echo "FAIL: the static trainer needs libtessera.so"; exit 1
fi
run_cluster "static trainer" "$work/trainer-static"

echo "== a prefix install, linked as install.md says: found through its rpath"
# The staged tree is a prefix install at $stage$prefix once its tessera.pc
# names that prefix: meson writes the prefix it was set up with there, and
# nothing else installed depends on it (the CMake package is relocatable).
mkdir -p "$work/prefix-pc" "$work/rpath"
sed "s|^prefix=.*|prefix=$stage$prefix|" "$stage$libdir/pkgconfig/tessera.pc" > "$work/prefix-pc/tessera.pc"
cp "$here/trainer.cc" "$work/rpath/"
doc_block=$(python3 "$here/../docs_commands.py" --print by-install "$here/../..")
(cd "$work/rpath" && env -u LD_LIBRARY_PATH -u PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH="$work/prefix-pc" \
  bash -euo pipefail -c "$doc_block") || { echo "FAIL: install.md's rpath command"; exit 1; }
loaded=$(env -u LD_LIBRARY_PATH ldd "$work/rpath/trainer")
grep -q "libtessera.so.0 => $stage$libdir/libtessera" <<< "$loaded" ||
  { echo "$loaded"; echo "FAIL: without LD_LIBRARY_PATH the trainer does not find the prefix's libtessera"; exit 1; }
# Without the rpath it fails as install.md says.
# shellcheck disable=SC2046
g++ -std=c++20 "$here/trainer.cc" -o "$work/rpath/no-rpath" \
  $(env -u PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH="$work/prefix-pc" pkg-config --cflags --libs tessera)
if out=$(env -u LD_LIBRARY_PATH "$work/rpath/no-rpath" 2>&1) ||
   ! grep -q "libtessera.so.0: cannot open shared object file" <<< "$out"; then
  echo "$out"; echo "FAIL: a trainer without the rpath did not fail as install.md says"; exit 1
fi
printf '#!/bin/sh\nexec env -u LD_LIBRARY_PATH "%s"\n' "$work/rpath/trainer" > "$work/rpath/run"
chmod +x "$work/rpath/run"
run_cluster "trainer with an rpath, no LD_LIBRARY_PATH" "$work/rpath/run"
echo "PASS: installed, consumed three ways, and linked into a prefix with an rpath"
