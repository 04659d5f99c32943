#!/usr/bin/env bash
# Builds the libFuzzer targets (in build-asan/: clang 14, ASan+UBSan) and runs each one for a fixed
# time on a scratch copy of its committed seed corpus, so the corpus in the tree never changes.
#   tests/fuzz/run.sh [seconds_per_target]     (default 20)
# Prints one line per target ("fuzz_x: N runs, C crashes") and exits non-zero if the build fails
# or any target crashes, times out or runs out of memory. Inputs that did are kept under
# build-asan/artifacts/<target>/; replay one with build-asan/tests/fuzz/<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${1:-20}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "run.sh: seconds_per_target must be a positive integer, got '$seconds'" >&2
  exit 2
fi
build=build-asan
targets=(fuzz_tx_decode fuzz_sign_bytes fuzz_address fuzz_manifest fuzz_chunk_wire
  fuzz_chunk_stream fuzz_collective_frame fuzz_event_query fuzz_rpc_request fuzz_abci_wire
  fuzz_gonka_v0)

# Longest input each target is given: a few times the largest real input, so time goes into
# structure rather than into hashing long buffers.
max_len_of() {
  case "$1" in
    fuzz_tx_decode) echo 16384 ;;
    fuzz_sign_bytes) echo 1024 ;;
    fuzz_address) echo 256 ;;
    fuzz_manifest) echo 16384 ;;
    fuzz_chunk_wire) echo 4096 ;;
    fuzz_chunk_stream) echo 4096 ;;
    fuzz_collective_frame) echo 8192 ;;
    fuzz_event_query) echo 1024 ;;
    fuzz_rpc_request) echo 4096 ;;
    fuzz_abci_wire) echo 4096 ;;
    fuzz_gonka_v0) echo 4096 ;;
  esac
}

scripts/build.sh asan "${targets[@]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=0
for t in "${targets[@]}"; do
  dir="$work/$t"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  if [ -d "tests/fuzz/corpus/$t" ]; then
    cp tests/fuzz/corpus/"$t"/* "$dir/corpus/"
  fi
  rc=0
  "$build/tests/fuzz/$t" "$dir/corpus" -max_total_time="$seconds" -max_len="$(max_len_of "$t")" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    >"$dir/log" 2>&1 || rc=$?
  runs="$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$dir/log" | grep -oE '[0-9]+$' |
    tail -n1 || true)"
  if [ -z "$runs" ]; then
    runs="$(grep -oE '^#[0-9]+' "$dir/log" | tail -n1 | tr -d '#' || true)"
  fi
  crashes="$(find "$dir/artifacts" -type f | wc -l)"
  echo "$t: ${runs:-0} runs, $crashes crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    keep="$build/artifacts/$t"
    mkdir -p "$keep"
    cp "$dir"/artifacts/* "$keep/" 2>/dev/null || true
    echo "--- $t exited with $rc; last lines of its log (inputs kept in $keep):" >&2
    tail -n 40 "$dir/log" >&2
  fi
done
exit "$failed"
