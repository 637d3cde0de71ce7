#!/usr/bin/env bash
# Makes `etcd` and `etcdctl` available for the tests and benchmarks, and prints the etcd path.
#
# Order of preference: $ETCD_BIN, an `etcd` on PATH, then the project-local copy under tools/etcd/.
# When none exists, the Debian 12 ("bookworm") packages `etcd-server` (etcd) and `etcd-client`
# (etcdctl), both etcd 3.4, are fetched from the same Debian archive this machine's apt already
# uses: we read the archive's URI from the apt sources, write a private sources list and lists
# directory under tools/, run `apt-get download` against them and unpack the .debs with `dpkg -x`.
# No root is needed for that part (apt-get update with a private lists directory runs as any user).
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

command -v apt-get >/dev/null || { log "apt-get not found; install etcd 3.4+ (etcd and etcdctl) and put it on PATH or set ETCD_BIN"; exit 1; }

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
log "fetching etcd-server and etcd-client from the bookworm suite of $archive"

apt_dir="$tools/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$tools/deb"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=""
[[ -r "$keyring" ]] && signed="[signed-by=$keyring]"
echo "deb $signed $archive bookworm main" >"$apt_dir/sources.list"

apt_opts=(
  -o "Dir::Etc::SourceList=$apt_dir/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
)
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$tools/deb" && apt-get "${apt_opts[@]}" -qq download etcd-server etcd-client >&2)
for pkg in etcd-server etcd-client; do
  debs=("$tools"/deb/"${pkg}"_*.deb)
  deb=${debs[0]}
  [[ -f "$deb" ]] || { log "apt-get download left no ${pkg}_*.deb in $tools/deb"; exit 1; }
  dpkg -x "$deb" "$tools/root"
done
[[ -x "$local_bin" ]] || { log "unpacked etcd-server but found no usr/bin/etcd in it"; exit 1; }
[[ -x "$local_ctl" ]] || { log "unpacked etcd-client but found no usr/bin/etcdctl in it"; exit 1; }
version=$("$local_bin" --version)
log "installed ${version%%$'\n'*} at $local_bin (etcdctl beside it)"
echo "$local_bin"
