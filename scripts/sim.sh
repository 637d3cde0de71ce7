#!/usr/bin/env bash
# Sweeps the deterministic simulation (lease-sim): N schedules of each backend's model, seeds
# FROM..FROM+N, on every core. Prints each failing seed with the command that replays it, and one
# RESULT line per backend; exits 1 if any schedule failed or any seed run twice gave two
# histories.
#
#   bash scripts/sim.sh 100000                  # 100,000 schedules of Consul, then of etcd
#   bash scripts/sim.sh 1000000 --from 5000000  # another million, other seeds
#   bash scripts/sim.sh 20000 --backend etcd    # one backend
#   bash scripts/sim.sh 1000 --jobs 1           # one core
#
# A failure replays with `cargo run -p lease-sim --release -- run <backend> --seed N --history`
# (LEASE_SIM_LIVE=1 prints the history as it is written). CI runs 150 of each (lease-sim's `sweep`
# test, in scripts/test.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

count=${1:?usage: bash scripts/sim.sh N [--from SEED] [--backend consul|etcd] [--jobs J]}
shift
from=0
backends=(consul etcd)
jobs=$(nproc)
while (($#)); do
  case $1 in
    --from) from=$2; shift 2 ;;
    --backend) backends=("$2"); shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 64 ;;
  esac
done

# Its own target directory: a release build beside the tests' debug one, which a running
# `cargo test` would otherwise wait on.
export CARGO_TARGET_DIR=${LEASE_SIM_TARGET_DIR:-target/sim}
cargo build --quiet --release -p lease-sim --bin lease-sim
status=0
for backend in "${backends[@]}"; do
  "$CARGO_TARGET_DIR/release/lease-sim" sweep "$backend" --from "$from" --count "$count" \
    --jobs "$jobs" --twice-every 100 || status=$?
done
exit "$status"
