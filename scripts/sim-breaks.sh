#!/usr/bin/env bash
# Shows the simulation finds what it exists to find: each patch in lease-sim/breaks/ puts back
# one safety break that was found by luck before lease-sim existed. For each, in a scratch git
# worktree of HEAD with the patch applied, the patched lease-sim sweeps its backend's seeds from
# 0 upwards, CHUNK at a time, until a schedule fails or MAX seeds passed, and prints
#
#   RESULT sim_break=<patch> backend=<b> seeds_to_find=<n> first_failing_seed=<s> wall_s=<t>
#
# (seeds_to_find=none when MAX seeds all passed). Exits 1 if a break went unfound.
#
#   bash scripts/sim-breaks.sh                      # every patch, up to 5,000 seeds each
#   bash scripts/sim-breaks.sh --max 20000 --only etcd-join-then-read
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

max=5000
chunk=200
only=
jobs=$(nproc)
while (($#)); do
  case $1 in
    --max) max=$2; shift 2 ;;
    --chunk) chunk=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 64 ;;
  esac
done


# A target directory of its own: a patched tree built into the one scripts/sim.sh uses would
# leave its patched crates there for a later unpatched build to take as fresh (cargo names a
# path crate's build by its place in the workspace, and the patched files are the newer ones).
export CARGO_TARGET_DIR=${LEASE_SIM_BREAKS_TARGET_DIR:-$root/target/sim-breaks}
scratch=$(mktemp -d)
tree=$scratch/tree
cleanup() {
  git -C "$root" worktree remove --force "$tree" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

# HEAD's own simulation, unpatched: a schedule that fails without the patch too is today's bug,
# not the break's find, and the sweep goes on past it.
git -C "$root" worktree add --quiet --detach "$tree" HEAD
(cd "$tree" && cargo build --quiet --release -p lease-sim --bin lease-sim 2>/dev/null)
cp "$CARGO_TARGET_DIR/release/lease-sim" "$scratch/unpatched"
fails_unpatched() {
  local out
  out=$("$scratch/unpatched" run "$1" --seed "$2" 2>&1 || true)
  [[ $'\n'$out == *$'\n'VIOLATION* ]]
}

status=0
for patch in "$root"/lease-sim/breaks/*.patch; do
  name=$(basename "$patch" .patch)
  [[ -z $only || $only == "$name" ]] || continue
  backend=$(sed -n 's/^Backend: //p' "$patch")
  git -C "$root" worktree remove --force "$tree" 2>/dev/null || true
  git -C "$root" worktree add --quiet --detach "$tree" HEAD
  git -C "$tree" apply "$patch"
  (cd "$tree" && cargo build --quiet --release -p lease-sim --bin lease-sim 2>/dev/null) || {
    echo "$name: the patched tree does not build; refresh the patch" >&2
    status=1
    continue
  }
  started=$SECONDS
  found=none
  for ((from = 0; from < max; from += chunk)); do
    count=$((max - from < chunk ? max - from : chunk))
    out=$("$CARGO_TARGET_DIR/release/lease-sim" sweep "$backend" --from "$from" --count "$count" \
      --jobs "$jobs" --twice-every 0 || true)
    first=
    for seed in $(sed -n 's/^FAILED seed \([0-9]*\):.*/\1/p' <<<"$out" | sort -n); do
      if fails_unpatched "$backend" "$seed"; then
        echo "$name: seed $seed fails without the patch too (today's bug, not the break's); going on" >&2
        continue
      fi
      first=$seed
      break
    done
    if [[ -n $first ]]; then
      found=$first
      # The failing schedule, its violations and its replay command.
      awk -v head="FAILED seed $first:" 'index($0, head) == 1 { p = 1 } p { print } p && /replay:/ { exit }' <<<"$out"
      break
    fi
  done
  if [[ $found == none ]]; then
    echo "RESULT sim_break=$name backend=$backend seeds_to_find=none seeds_run=$max wall_s=$((SECONDS - started))"
    status=1
  else
    echo "RESULT sim_break=$name backend=$backend seeds_to_find=$((found + 1)) first_failing_seed=$found wall_s=$((SECONDS - started))"
  fi
done
exit "$status"
