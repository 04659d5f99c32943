#!/usr/bin/env bash
# Configures and builds one flavour of the project.
#   scripts/build.sh [release|asan] [ninja targets...]
# Build directories: build/ (release, GCC), build-asan/ (clang 14 with ASan+UBSan and
# -Wthread-safety; it also builds the libFuzzer targets).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour="${1:-release}"
shift || true
jobs="${TS_JOBS:-$(nproc)}"
# ccache (when present) keys on paths relative to the checkout, so clones in other folders (CI)
# reuse what an earlier build compiled. The build is the same without it.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
export CCACHE_NOHASHDIR=1
case "$flavour" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug -DTS_SANITIZE=ON
                               -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14) ;;
  *) echo "build.sh: unknown flavour '$flavour' (release|asan)" >&2; exit 2 ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
fi
ninja -C "$dir" -j "$jobs" "$@"
