#!/usr/bin/env bash
# Runs every test of the project on a fresh Debian 12 machine: installs the packages, builds,
# runs the unit and functional suites (ctest), the unit suites again under ASan+UBSan, the
# libFuzzer targets briefly, the format check and the check of the #include graph against the
# library table (scripts/check_layers.py).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "dependencies"
scripts/install-deps.sh

step "format check"
bad=$(git ls-files '*.cc' '*.h' | grep -v '^tests/fuzz/corpus/' | xargs clang-format --dry-run 2>&1 | grep -c 'warning:' || true)
if [ "$bad" != "0" ]; then
  git ls-files '*.cc' '*.h' | xargs clang-format --dry-run 2>&1 | head -20
  echo "format check: $bad places differ from .clang-format" >&2
  exit 1
fi

step "layers"
python3 scripts/check_layers.py

step "release build"
scripts/build.sh release

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

step "tests (release)"
(cd build && ctest --output-on-failure --timeout 900 -j 2) | tee "$logs/release.log"

step "ASan+UBSan build"
scripts/build.sh asan

step "unit tests (ASan+UBSan)"
# The simulation's seeds under faults: 200 in the release run above (thousands in
# scripts/soak.sh); here the sanitizers look for memory errors, which half of them show as well.
(cd build-asan && TS_SIM_SEEDS=100 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure \
  --timeout 900 -L unit -j 2) |
  tee "$logs/asan.log"

step "fuzz (brief)"
tests/fuzz/run.sh "${TS_FUZZ_SECONDS:-15}" | tee "$logs/fuzz.log"

# One closing line over every suite: ctest's counts of both runs plus one per fuzz target.
count() { cat "$logs"/*.log | grep -oE "$1" | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}'; }
total=$(count 'out of [0-9]+')
failed=$(count '[0-9]+ tests failed')
fuzz=$(grep -c ' 0 crashes$' "$logs/fuzz.log" || true)
step "done"
echo "tests: $((total - failed + fuzz)) passed, $failed failed"
