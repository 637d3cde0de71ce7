#!/usr/bin/env bash
# Makes a `consul` binary available for the tests and benchmarks, and prints its path.
#
# Order of preference: $CONSUL_BIN, a `consul` on PATH, then the project-local copy under
# tools/consul/. When none exists, the Debian 11 ("bullseye") package `consul` (1.8.7) is fetched
# from the same Debian archive this machine's apt already uses: we read the archive's URI from the
# apt sources, write a private sources list and lists directory under tools/, run
# `apt-get download` against them and unpack the .deb with `dpkg -x`. No root is needed for that
# part (apt-get update with a private lists directory runs as any user).
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

command -v apt-get >/dev/null || { log "apt-get not found; install Consul 1.8.x and put it on PATH or set CONSUL_BIN"; exit 1; }

# The archive URI of the machine's own Debian sources (deb822 or one-line format).
archive=""
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [[ -r "$f" ]] || continue
  case "$f" in
    *.sources)
      uri=$(awk '/^URIs:/ {print $2; exit}' "$f" | grep -v -- '-security' || true)
      if [[ -z "$uri" ]]; then
        # The first line by parameter expansion, not by piping into an early-exiting reader: under
        # pipefail the reader's exit kills the writer with SIGPIPE (exit 141).
        uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' "$f" | grep -v -- '-security' || true)
        uri=${uri%%$'\n'*}
      fi
      ;;
    *)
      uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f" | grep -v -- '-security' || true)
      ;;
  esac
  if [[ -n "$uri" ]] && grep -q 'debian' <<<"$uri"; then archive="${uri%/}"; break; fi
done
[[ -n "$archive" ]] || { log "could not find a Debian archive URI in the apt sources"; exit 1; }
log "fetching consul from the bullseye suite of $archive"

apt_dir="$tools/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$tools/deb"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=""
[[ -r "$keyring" ]] && signed="[signed-by=$keyring]"
echo "deb $signed $archive bullseye main" >"$apt_dir/sources.list"

apt_opts=(
  -o "Dir::Etc::SourceList=$apt_dir/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
)
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$tools/deb" && apt-get "${apt_opts[@]}" -qq download consul >&2)
debs=("$tools"/deb/consul_*.deb)
deb=${debs[0]}
[[ -f "$deb" ]] || { log "apt-get download left no consul_*.deb in $tools/deb"; exit 1; }
dpkg -x "$deb" "$tools/root"
[[ -x "$local_bin" ]] || { log "unpacked $deb but found no usr/bin/consul in it"; exit 1; }
version=$("$local_bin" version)
log "installed ${version%%$'\n'*} at $local_bin"
echo "$local_bin"
