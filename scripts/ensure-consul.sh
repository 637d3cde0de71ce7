#!/usr/bin/env bash
# Makes a `consul` binary available for the tests and benchmarks, and prints its path.
#
# Order of preference: $CONSUL_BIN, a `consul` on PATH, then the project-local copy under
# tools/consul/. When none exists, the Debian 11 ("bullseye") package `consul` (1.8.7) is fetched
# from the same Debian archive this machine's apt already uses: we read the archive's URI from the
# apt sources, write a private sources list and lists directory under tools/, run
# `apt-get download` against them and unpack the .deb with `dpkg -x`. No root is needed for that
# part (apt-get update with a private lists directory runs as any user); scripts/fetch-debs.sh does it.
#
# Idempotent: a second run finds the unpacked binary and does nothing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/tools/consul"
local_bin="$tools/root/usr/bin/consul"

log() { echo "ensure-consul: $*" >&2; }

if [[ -n "${CONSUL_BIN:-}" && -x "${CONSUL_BIN}" ]]; then
  echo "$CONSUL_BIN"; exit 0
fi
if command -v consul >/dev/null 2>&1; then
  command -v consul; exit 0
fi
if [[ -x "$local_bin" ]]; then
  echo "$local_bin"; exit 0
fi

bash "$root/scripts/fetch-debs.sh" "$tools" bullseye consul ||
  { log "could not fetch consul (bullseye); install Consul 1.8.x and put it on PATH or set CONSUL_BIN"; exit 1; }
[[ -x "$local_bin" ]] || { log "unpacked consul but found no usr/bin/consul in it"; exit 1; }
version=$("$local_bin" version)
log "installed ${version%%$'\n'*} at $local_bin"
echo "$local_bin"
