#!/usr/bin/env bash
# Makes `etcd` and `etcdctl` available for the tests and benchmarks, and prints the etcd path.
#
# Order of preference: $ETCD_BIN, an `etcd` on PATH, then the project-local copy under tools/etcd/.
# When none exists, the Debian 12 ("bookworm") packages `etcd-server` (etcd) and `etcd-client`
# (etcdctl), both etcd 3.4, are fetched from the same Debian archive this machine's apt already
# uses: we read the archive's URI from the apt sources, write a private sources list and lists
# directory under tools/, run `apt-get download` against them and unpack the .debs with `dpkg -x`.
# No root is needed for that part; scripts/fetch-debs.sh does it (shared with ensure-consul.sh).
# `etcdctl` is found next to the printed `etcd` (the tests look there, or at $ETCDCTL_BIN).
#
# Idempotent: a second run finds the unpacked binaries and does nothing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/tools/etcd"
local_bin="$tools/root/usr/bin/etcd"
local_ctl="$tools/root/usr/bin/etcdctl"

log() { echo "ensure-etcd: $*" >&2; }

if [[ -n "${ETCD_BIN:-}" && -x "${ETCD_BIN}" ]]; then
  echo "$ETCD_BIN"; exit 0
fi
if command -v etcd >/dev/null 2>&1; then
  command -v etcd; exit 0
fi
if [[ -x "$local_bin" && -x "$local_ctl" ]]; then
  echo "$local_bin"; exit 0
fi

bash "$root/scripts/fetch-debs.sh" "$tools" bookworm etcd-server etcd-client ||
  { log "could not fetch etcd-server etcd-client (bookworm); install etcd 3.4+ (etcd and etcdctl) and put it on PATH or set ETCD_BIN"; exit 1; }
[[ -x "$local_bin" ]] || { log "unpacked etcd-server but found no usr/bin/etcd in it"; exit 1; }
[[ -x "$local_ctl" ]] || { log "unpacked etcd-client but found no usr/bin/etcdctl in it"; exit 1; }
version=$("$local_bin" --version)
log "installed ${version%%$'\n'*} at $local_bin (etcdctl beside it)"
echo "$local_bin"
