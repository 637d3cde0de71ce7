#!/usr/bin/env bash
# Fetches Debian packages from a given suite of the Debian archive this machine's apt already uses,
# and unpacks them into a project-local folder. Used by ensure-consul.sh and ensure-etcd.sh.
#
#   bash scripts/fetch-debs.sh TOOLS_DIR SUITE PACKAGE...
#
# Reads the archive's URI from the apt sources (deb822 or one-line format), writes a private sources
# list and lists directory under TOOLS_DIR/apt, runs `apt-get download` against them, and unpacks
# each .deb with `dpkg -x` into TOOLS_DIR/root. No root is needed (apt-get update with a private
# lists directory runs as any user), and no registry host is written anywhere.
set -euo pipefail

tools=$1
suite=$2
shift 2
log() { echo "fetch-debs: $*" >&2; }

command -v apt-get >/dev/null || { log "apt-get not found"; exit 1; }

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
log "fetching $* from the $suite suite of $archive"

apt_dir="$tools/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$tools/deb"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=""
[[ -r "$keyring" ]] && signed="[signed-by=$keyring]"
echo "deb $signed $archive $suite main" >"$apt_dir/sources.list"

apt_opts=(
  -o "Dir::Etc::SourceList=$apt_dir/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
)
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$tools/deb" && apt-get "${apt_opts[@]}" -qq download "$@" >&2)
for pkg in "$@"; do
  debs=("$tools"/deb/"${pkg}"_*.deb)
  deb=${debs[0]}
  [[ -f "$deb" ]] || { log "apt-get download left no ${pkg}_*.deb in $tools/deb"; exit 1; }
  dpkg -x "$deb" "$tools/root"
done
