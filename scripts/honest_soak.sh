#!/usr/bin/env bash
# No false positives (docs/verification.md "Where it is tested"), about a minute a run here:
#   scripts/honest_soak.sh [RUNS] [SHAPE]
# RUNS seeded shards (default 20) of the attack suite's run spec with every host honest, on one
# network of SHAPE equal-weight hosts (4 or 7, default 4) whose workers run on one and two
# threads and replay each other's steps: nobody may be marked or rejected, every host is paid,
# the hosts end on one root. One JSON line per shard; exits 1 when a check fails.
# Builds what it needs in build/ (release).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-20}"
shape="${2:-4}"
scripts/build.sh release >/dev/null
log=$(mktemp /tmp/honest-soak-XXXXXX.log)
echo "== $runs honest seeded runs, $shape hosts (the whole output: $log)"
status=0
(cd tests/functional && TS_BUILD_DIR="$PWD/../../build" TS_HONEST_SEEDS="$runs" \
   TS_ATTACK_SHAPE="$shape" /usr/bin/python3 test_attacks.py AttackTest.test_honest_runs_mark_no_one \
   >>"$log" 2>&1) || status=1
grep -E '^ATTACK ' "$log" | python3 -c '
import json, sys
runs = [json.loads(l[len("ATTACK "):]) for l in sys.stdin]
for r in runs:
    print("seed %d: %6.1f s, eval loss %.4f, marks %d, rejected %d, roots %d, least paid %d" % (
        r["seed"], r["seconds"], r["final_eval_loss"], sum(r["marks"].values()),
        sum(r["rejected"].values()), r["roots"], min(r["paid"].values())))
marked = sum(1 for r in runs if any(r["marks"].values()) or any(r["rejected"].values()))
print("%d runs, %d with an honest host marked or rejected" % (len(runs), marked))'
[ $status = 0 ] || grep -E -B2 -A12 '^(FAIL|ERROR):' "$log"
exit $status
