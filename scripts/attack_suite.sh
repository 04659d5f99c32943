#!/usr/bin/env bash
# The verification benchmarks (docs/benchmarks.md "Verification"), about 45 minutes here:
#   scripts/attack_suite.sh [SEEDS]
# 1. Detection: the simulation runs an attacker (sign_flip, one of four equal hosts, 8 rounds,
#    no faults) for SEEDS seeds (default 200) at each replay rate, and prints how often it was
#    marked and paid nothing beside 1 − (1 − p)^6 (six rounds whose failure the run can still
#    confirm).
# 2. Every attack in real shards (tests/functional/test_attacks.py, TS_ATTACKS=all): 1 attacker
#    of 4 hosts, then 2 of 7; one JSON line per shard (final eval loss against the honest run's,
#    marks, pay, the verification's seconds). Exits 1 when a check of the suite fails.
# Builds what it needs in build/ (release).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-200}"
scripts/build.sh release >/dev/null

echo "== detection: sign_flip, 1 of 4 equal hosts, 8 rounds, $seeds seeds a rate"
printf '%8s %10s %10s %12s\n' "rate" "marked" "unpaid" "1-(1-p)^6"
for bps in 500 1000 2500 5000 10000; do
  line=$(build/tests/sim/ts_round_sim --from 1 --seeds "$seeds" --no-faults --attack sign_flip \
           --attacker 1 --hosts 4 --rounds 8 --replay-rate-bps "$bps" 2>/dev/null | tail -1)
  marked=$(sed -E 's/.* marked in ([0-9]+) and paid nothing in ([0-9]+) of ([0-9]+).*/\1/' <<<"$line")
  unpaid=$(sed -E 's/.* marked in ([0-9]+) and paid nothing in ([0-9]+) of ([0-9]+).*/\2/' <<<"$line")
  total=$(sed -E 's/.* marked in ([0-9]+) and paid nothing in ([0-9]+) of ([0-9]+).*/\3/' <<<"$line")
  python3 -c "p=$bps/1e4; print(f'{p:8.2f} {$marked/$total:10.3f} {$unpaid/$total:10.3f} {1-(1-p)**6:12.3f}')"
done

status=0
log=$(mktemp /tmp/attack-suite-XXXXXX.log)
for shape in 4 7; do
  echo "== every attack in real shards, shape $shape (the whole output: $log)"
  (cd tests/functional && TS_BUILD_DIR="$PWD/../../build" TS_ATTACKS=all TS_ATTACK_SHAPE=$shape \
     /usr/bin/python3 test_attacks.py >>"$log" 2>&1) || status=1
  grep -E '^ATTACK ' "$log" | tail -n 13
done
[ $status = 0 ] || grep -E -B2 -A12 '^(FAIL|ERROR):' "$log"
exit $status
