# shellcheck shell=bash
# A container engine for the container tests on a Debian 12 machine without
# Docker: podman, set up for this host, with its Docker API served for
# testcontainers and Compose, and Compose 2 itself. Sourced by .ci/run (root):
#
#   source .ci/container-engine.sh
#   install_container_engine      # apt packages, Compose; nothing if present
#   start_container_engine        # config, API service, exports; non-zero with the reason
#   ...
#   stop_container_engine         # the API service it started
#
# After start_container_engine the environment has CONTAINERS_CONF,
# DOCKER_HOST and TESTCONTAINERS_RYUK_DISABLED.

CONTAINER_CACHE=${CONTAINER_CACHE:-/var/cache/redis-lock-proxy-ci}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
podman_service_pid=""

install_container_engine() {
  local packages=() tool
  # mmdebstrap: the tests make their base and server images from Debian packages (no registry).
  for tool in podman runc netavark aardvark-dns iptables catatonit mmdebstrap; do
    dpkg-query -W -f='${Status}' "$tool" 2>/dev/null | grep -q 'ok installed' || packages+=("$tool")
  done
  if [[ ${#packages[@]} -gt 0 ]]; then
    echo "--- installing ${packages[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
  fi
  install_compose
}

# Compose 2 for the Compose example: Debian 13's docker-compose, a static binary
# needing nothing but libc, taken from its .deb with dpkg -x. Bookworm's apt
# fetches it through a sources list of its own, leaving the system's alone.
install_compose() {
  local bin="$CONTAINER_CACHE/bin" apt="$CONTAINER_CACHE/apt-trixie"
  export PATH="$bin:$PATH"
  if [[ -x "$bin/docker-compose" ]]; then return; fi
  echo "--- fetching docker-compose from Debian trixie"
  mkdir -p "$bin" "$apt/lists/partial" "$apt/archives/partial"
  echo "deb $DEBIAN_MIRROR trixie main" >"$apt/sources.list"
  local options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt" -o "Dir::Cache::Archives=$apt/archives")
  apt-get "${options[@]}" update -q
  (cd "$apt" && apt-get "${options[@]}" download docker-compose)
  rm -rf "$apt/x"
  dpkg -x "$apt"/docker-compose_*.deb "$apt/x"
  install -m 0755 "$apt/x/usr/libexec/docker/cli-plugins/docker-compose" "$bin/docker-compose"
}

# podman on this kind of host: runc (crun 1.8 refuses a hybrid cgroup layout),
# the cgroupfs manager (no systemd), and default ulimits the host's hard limits
# allow (podman's default nofile of 1048576 fails: "setrlimit ... Operation not
# permitted"; nproc is kept at 32768 or below).
write_containers_conf() {
  local conf="$CONTAINER_CACHE/containers.conf" nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [[ "$nofile" == unlimited ]] && nofile=1048576
  if [[ "$nproc" == unlimited || "$nproc" -gt 32768 ]]; then nproc=32768; fi
  mkdir -p "$CONTAINER_CACHE"
  cat >"$conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
EOF
  export CONTAINERS_CONF="$conf"
}

start_container_engine() {
  write_containers_conf
  local out
  # The smallest container there is: the host's root under a throwaway overlay, no image needed.
  if ! out=$(podman run --rm --network none --rootfs /:O true 2>&1); then
    echo "container engine: podman cannot start a container: $out"
    return 1
  fi
  # The Docker API, on a socket of this run's own (other runs on the machine may serve theirs).
  local socket="/run/redis-lock-proxy-ci/podman-$$.sock"
  mkdir -p "$(dirname "$socket")"
  podman system service --time=0 "unix://$socket" >"$CONTAINER_CACHE/podman-service-$$.log" 2>&1 &
  podman_service_pid=$!
  local waited=0
  until podman --remote --url "unix://$socket" version >/dev/null 2>&1; do
    if ! kill -0 "$podman_service_pid" 2>/dev/null || [[ $waited -ge 60 ]]; then
      echo "container engine: podman's API service did not come up on $socket: $(tail -n 5 "$CONTAINER_CACHE/podman-service-$$.log")"
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  export DOCKER_HOST="unix://$socket"
  # testcontainers' reaper (Ryuk) is an image on Docker Hub, which is not reachable; the tests
  # remove their own containers.
  export TESTCONTAINERS_RYUK_DISABLED=true
  echo "container engine: $(podman version --format 'podman {{.Client.Version}}'), Docker API at $DOCKER_HOST"
}

stop_container_engine() {
  if [[ -n "$podman_service_pid" ]]; then
    kill "$podman_service_pid" 2>/dev/null || true
    wait "$podman_service_pid" 2>/dev/null || true
    rm -f "/run/redis-lock-proxy-ci/podman-$$.sock"
    podman_service_pid=""
  fi
}
