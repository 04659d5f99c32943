#!/usr/bin/env bash
# The round protocol's simulation for many seeds (docs/training.md "Simulation"):
#   scripts/soak.sh [N] [FIRST]    N seeds (default 10000) from FIRST (default 1)
# Builds ts_round_sim in build/ (release) and runs it; prints a line per failing seed with the
# command that replays it, and exits 1 if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-10000}"
first="${2:-1}"
scripts/build.sh release ts_round_sim >/dev/null
exec build/tests/sim/ts_round_sim --from "$first" --seeds "$seeds"
