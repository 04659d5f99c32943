#!/usr/bin/env bash
# Configures and builds one flavour of the project.
#   scripts/build.sh [release|asan|fuzz] [ninja targets...]
# Build directories: build/ (release), build-asan/ (ASan+UBSan), build-fuzz/ (clang libFuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour="${1:-release}"
shift || true
jobs="${TS_JOBS:-$(nproc)}"
case "$flavour" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug -DTS_SANITIZE=ON) ;;
  fuzz) dir=build-fuzz; flags=(-DTS_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14) ;;
  *) echo "build.sh: unknown flavour '$flavour' (release|asan|fuzz)" >&2; exit 2 ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
fi
ninja -C "$dir" -j "$jobs" "$@"
