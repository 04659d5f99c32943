#!/usr/bin/env bash
# The main job on the embedded default: installs what it needs, builds, then runs a devnet chain
# and three host sidecars on loopback through a whole shard lifecycle (proposal, votes, opening,
# reservations, settlement, payouts) and prints what happens.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release trainshard trainshardd ts_worker_main
exec /usr/bin/python3 tests/functional/demo.py "$@"
