#!/usr/bin/env bash
# Redis source trees for the tests: Debian's source packages, unpacked from
# their original (upstream) tarballs, each with the server's own test suite
# (tests/). What the project's tests and `npm run redis-suite` need:
#
#   redis-7.0.15  Debian 12's Redis: its tests/ only (the server is Debian's
#                 redis-server 7.0.15, which every other test runs against)
#   redis-6.0.16  Debian 11's Redis, built (src/redis-server, src/redis-cli):
#                 the line before 7.0, which has no EXPIRE ... NX
#
# Usage: .ci/redis-servers.sh [DIR]
#   DIR defaults to $REDIS_SERVERS_DIR, else ~/.cache/redis-lock-proxy-test/servers
#   (test/support/server-builds.ts looks there). A tree already there is kept,
#   so a second run on the same machine takes seconds.
#
# Needs apt-get (any user: it uses a state directory of its own, with
# deb-src entries for bookworm and bullseye, and leaves the system's sources
# alone), tar, make and a C compiler; tclsh runs the suites.
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DIR=${1:-${REDIS_SERVERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/redis-lock-proxy-test/servers}}

# name  Debian-release  build?
SERVERS=(
  "redis-7.0.15 bookworm no"
  "redis-6.0.16 bullseye yes"
)

apt_dir="$DIR/.apt"
apt_options=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir" -o "Dir::Cache::Archives=$apt_dir/archives"
  -o APT::Sandbox::User=root -o Debug::NoLocking=1)
apt_updated=""

apt_update_once() {
  [[ -n "$apt_updated" ]] && return
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  printf 'deb-src %s %s main\n' "$MIRROR" bookworm "$MIRROR" bullseye >"$apt_dir/sources.list"
  apt-get "${apt_options[@]}" update -q >/dev/null
  apt_updated=1
}

# The upstream tarball of Debian's source package `redis` in `release`, unpacked as $DIR/$name.
fetch_source() {
  local name=$1 release=$2 version=${1#redis-} work
  apt_update_once
  work=$(mktemp -d "$DIR/.fetch-XXXXXX")
  (cd "$work" && apt-get "${apt_options[@]}" source --download-only -q "redis/$release" >/dev/null)
  local tarball="$work/redis_${version}.orig.tar.gz"
  if [[ ! -f "$tarball" ]]; then
    echo "redis-servers: Debian $release's source package redis is not $version (got: $(ls "$work"))" >&2
    rm -rf "$work"
    return 1
  fi
  tar -xzf "$tarball" -C "$work"
  rm -rf "${DIR:?}/$name"
  mv "$work/$name" "$DIR/$name"
  rm -rf "$work"
}

build() {
  local name=$1
  # Without TLS (not needed for these tests) and with the bundled jemalloc and Lua, as upstream builds it.
  make -C "$DIR/$name" -j"$(nproc)" BUILD_TLS=no >"$DIR/$name.build.log" 2>&1 || {
    echo "redis-servers: building $name failed; the end of $DIR/$name.build.log:" >&2
    tail -n 20 "$DIR/$name.build.log" >&2
    return 1
  }
}

mkdir -p "$DIR"
for entry in "${SERVERS[@]}"; do
  read -r name release wanted_build <<<"$entry"
  started=$SECONDS
  if [[ ! -f "$DIR/$name/tests/test_helper.tcl" ]]; then
    echo "--- $name: fetching Debian $release's source package"
    fetch_source "$name" "$release"
  fi
  if [[ "$wanted_build" == yes && ! -x "$DIR/$name/src/redis-server" ]]; then
    echo "--- $name: building"
    build "$name"
  fi
  echo "$name: $DIR/$name ($((SECONDS - started)) s)"
done
