#!/usr/bin/env bash
# Runs the project's docker-compose.yml for real on this machine: FerretDB on PostgreSQL,
# tailrace and Prometheus (the `ferretdb` profile), from images built here.
#
#   scripts/stack.sh up           build what is missing, start a Docker daemon, compose up --wait
#   scripts/stack.sh down         compose down (containers, volumes), stop the daemon
#   scripts/stack.sh compose ...  docker compose with this stack's files, e.g. `compose logs`
#   scripts/stack.sh env          the variables under which `docker compose` reaches the stack
#   scripts/stack.sh prepare      only build compose and the base image (what needs no cargo)
#
# Needs root (it runs dockerd), Debian's docker.io and debootstrap (installed when missing), Go
# (compose v2 and FerretDB are built from the Go module proxy) and cargo. No image registry is
# needed or used. Each step says what it does; a failure names the fix.
#
# The daemon is this script's own: its own socket, data root, exec root and PID file, no
# bridge, no iptables, no IP forwarding or masquerading. Every container runs on the host's
# network and every service listens on 127.0.0.1 only (scripts/stack/compose.host.yml, the
# override for this machine; docker-compose.yml is the users' file, run as it is).
#
# Caches (outside the clone, so a second run is warm), each keyed by what it was built from:
#   $cache/compose/<version>/      docker compose v2, built from the Go module proxy
#   $cache/base/<key>.tar          Debian bookworm (debootstrap --variant=minbase), key = recipe
#   $cache/docker/                 the daemon's data root: images and BuildKit's layer cache
#                                  (content-addressed: the tailrace binary image is tagged by
#                                  the binary's sha256, the base by its key)
# FerretDB comes from scripts/ferretdb.sh's cache, the release binary from cargo's target dir.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TAILRACE_STACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tailrace-stack}
# State of the running stack (socket, PID file, exec root): short, because unix socket paths
# are limited to 108 bytes.
run=${TAILRACE_STACK_RUN:-/run/tailrace-stack}
compose_version=v2.40.3
project=tailrace-stack
profile=ferretdb
# The base image's recipe: change any of these and the key (and so the cached image) changes.
suite=bookworm
variant=minbase
mirror=http://deb.debian.org/debian
base_recipe="debootstrap --variant=$variant $suite $mirror; apt lists and caches removed; v1"

say() { echo "stack.sh: $*" >&2; }
die() { echo "stack.sh: error: $*" >&2; exit 1; }

key_of() { printf '%s' "$1" | sha256sum | cut -c1-16; }

need_root() { [ "$(id -u)" = 0 ] || die "run as root: it starts its own dockerd (sudo $0 $*)"; }

# Debian's docker.io (dockerd 20.10, containerd, runc) and debootstrap, when missing. The
# package's policy keeps its service from starting; nothing else is started here.
install_packages() {
  local need=()
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  if ((${#need[@]})); then
    say "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
      die "apt-get install ${need[*]} failed"
  fi
  command -v docker >/dev/null 2>&1 || die "no docker CLI in PATH (apt-get install docker.io)"
}

# docker compose v2 as a CLI plugin in $DOCKER_CONFIG/cli-plugins. Why not `go install`: the
# module's go.mod has `exclude` directives, which `go install pkg@version` refuses.
compose_config=$cache/compose/$compose_version
compose_bin=$compose_config/cli-plugins/docker-compose
build_compose() {
  [ -x "$compose_bin" ] && return 0
  command -v go >/dev/null 2>&1 || die "go is not installed (compose v2 is built from the Go module proxy)"
  say "building docker compose $compose_version into $compose_bin (about 5 minutes on 2 cores)"
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
  local src work
  src=$(go mod download -json "github.com/docker/compose/v2@$compose_version" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') ||
    die "go mod download github.com/docker/compose/v2@$compose_version failed (is the Go module proxy reachable?)"
  work=$(mktemp -d)
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  mkdir -p "$(dirname "$compose_bin")"
  if ! (cd "$work" && go build -trimpath \
    -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$compose_version" \
    -o "$compose_bin.tmp" ./cmd); then
    rm -rf "$work"
    die "go build of docker compose $compose_version failed"
  fi
  rm -rf "$work"
  mv "$compose_bin.tmp" "$compose_bin"
}

# Debian bookworm from Debian's own mirror, as a tarball for `docker import`.
base_key=$(key_of "$base_recipe")
base_tar=$cache/base/$suite-$variant-$base_key.tar
base_image=$project/debian:$suite-$base_key
build_base() {
  [ -s "$base_tar" ] && return 0
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap is missing (apt-get install debootstrap)"
  say "debootstrap --variant=$variant $suite from $mirror (about 90 s)"
  local dir
  dir=$(mktemp -d)
  if ! debootstrap --variant="$variant" "$suite" "$dir" "$mirror" >"$dir.log" 2>&1; then
    tail -n 20 "$dir.log" >&2
    rm -rf "$dir" "$dir.log"
    die "debootstrap failed (its log is above; is $mirror reachable?)"
  fi
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir.log"
  mkdir -p "$(dirname "$base_tar")"
  tar --numeric-owner -C "$dir" -cf "$base_tar.tmp" .
  rm -rf "$dir"
  mv "$base_tar.tmp" "$base_tar"
}

# The release binary of tailrace (with the MongoDB engine, the binary's default features).
tailrace_binary() {
  if [ -n "${TAILRACE_STACK_BINARY:-}" ]; then
    [ -x "$TAILRACE_STACK_BINARY" ] || die "TAILRACE_STACK_BINARY=$TAILRACE_STACK_BINARY is not an executable"
    echo "$TAILRACE_STACK_BINARY"
    return
  fi
  local target=${CARGO_TARGET_DIR:-$root/target}
  say "cargo build --release --locked -p tailrace (target dir $target)"
  (cd "$root" && CARGO_TARGET_DIR=$target cargo build --release --locked -p tailrace >&2) ||
    die "cargo build --release -p tailrace failed"
  echo "$target/release/tailrace"
}

# What needs no Rust build. FerretDB is not built here: scripts/ferretdb.sh builds it (once per
# version) when `up` asks for it, and CI's own `scripts/ferretdb.sh start` may be building it.
prepare() {
  install_packages
  build_compose
  build_base
}

sock=$run/docker.sock
pidfile=$run/dockerd.pid
export DOCKER_HOST=unix://$sock
export DOCKER_CONFIG=$compose_config

daemon_running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start_daemon() {
  if daemon_running; then
    say "dockerd already running (PID $(cat "$pidfile"), $sock)"
    return 0
  fi
  mkdir -p "$run" "$cache/docker"
  # Its own empty configuration, so that a machine's /etc/docker/daemon.json changes nothing.
  echo '{}' >"$run/daemon.json"
  # Whether a default-path network namespace mount was there before: `down` removes only one
  # this daemon made.
  [ -e /run/docker/netns/default ] && touch "$run/netns-default-preexisting"
  say "starting dockerd (data root $cache/docker, socket $sock, no bridge, no iptables)"
  dockerd --config-file="$run/daemon.json" \
    --data-root="$cache/docker" --exec-root="$run/exec" --pidfile="$pidfile" \
    --host="unix://$sock" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    >"$run/dockerd.log" 2>&1 &
  for _ in $(seq 100); do
    docker version >/dev/null 2>&1 && return 0
    if ! kill -0 $! 2>/dev/null; then
      tail -n 20 "$run/dockerd.log" >&2
      die "dockerd exited at start (its log is above: $run/dockerd.log)"
    fi
    sleep 0.2
  done
  tail -n 20 "$run/dockerd.log" >&2
  die "dockerd did not answer on $sock within 20 s ($run/dockerd.log)"
}

stop_daemon() {
  if daemon_running; then
    local pid
    pid=$(cat "$pidfile")
    say "stopping dockerd (PID $pid)"
    kill "$pid"
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      say "dockerd (PID $pid) still runs after 30 s: SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  local ns
  for ns in "$run/exec/netns/default" /run/docker/netns/default; do
    [ "$ns" = /run/docker/netns/default ] && [ -e "$run/netns-default-preexisting" ] && continue
    if mountpoint -q "$ns" 2>/dev/null; then umount "$ns" || say "could not unmount $ns"; fi
  done
  rm -rf "$run"
}

# The images the override names: the base (imported once per key), FerretDB's binary (the
# build context of its image), the tailrace binary as an
# image of its own (tagged by the binary's sha256; the Dockerfile's runtime stage copies it
# from there instead of building from source), then `compose build` for the rest.
images() {
  if ! docker image inspect "$base_image" >/dev/null 2>&1; then
    say "docker import $base_tar -> $base_image"
    docker import "$base_tar" "$base_image" >/dev/null || die "docker import of the base image failed"
  fi
  local bin sha stage ferretdb
  ferretdb=$("$root/scripts/ferretdb.sh" bin) ||
    die "scripts/ferretdb.sh bin failed (FerretDB's image needs its binary)"
  TAILRACE_STACK_FERRETDB_DIR=$(dirname "$ferretdb")
  export TAILRACE_STACK_FERRETDB_DIR
  bin=$(tailrace_binary)
  sha=$(sha256sum "$bin" | cut -c1-16)
  TAILRACE_STACK_BINARY_IMAGE=$project/tailrace-binary:$sha
  if ! docker image inspect "$TAILRACE_STACK_BINARY_IMAGE" >/dev/null 2>&1; then
    say "docker import $bin -> $TAILRACE_STACK_BINARY_IMAGE"
    stage=$(mktemp -d)
    install -D -m 0755 "$bin" "$stage/usr/local/bin/tailrace"
    tar --numeric-owner --owner=0 --group=0 -C "$stage" -c usr |
      docker import - "$TAILRACE_STACK_BINARY_IMAGE" >/dev/null || die "docker import of the tailrace binary failed"
    rm -rf "$stage"
  fi
  export TAILRACE_STACK_BINARY_IMAGE
  # The data root is a cache: keep one binary image (each is the size of the binary) and drop
  # the images and build layers that earlier builds left without a name.
  local old
  for old in $(docker images --format '{{.Repository}}:{{.Tag}}' "$project/tailrace-binary"); do
    [ "$old" = "$TAILRACE_STACK_BINARY_IMAGE" ] || docker rmi "$old" >/dev/null 2>&1 || true
  done
}

# After a build: images no tag points at any more, and build cache beyond 2 GB.
prune() {
  docker image prune --force >/dev/null 2>&1 || true
  docker builder prune --force --keep-storage 2GB >/dev/null 2>&1 || true
}

# The variables the override reads. Only `up` builds images; for other commands the build
# inputs are placeholders (compose interpolates the whole file, builds or not).
compose_env() {
  export TAILRACE_STACK_BASE_IMAGE=$base_image TAILRACE_STACK_DIR=$root/scripts/stack
  export TAILRACE_STACK_FERRETDB_DIR=${TAILRACE_STACK_FERRETDB_DIR:-unused}
  export TAILRACE_STACK_BINARY_IMAGE=${TAILRACE_STACK_BINARY_IMAGE:-unused}
  export COMPOSE_PROFILES=$profile
}

compose() {
  docker compose --project-name "$project" --project-directory "$root" \
    -f "$root/docker-compose.yml" -f "$root/scripts/stack/compose.host.yml" "$@"
}

# Ports the stack's services bind on the host: fail before `up` if another process has one.
check_ports() {
  local port busy=()
  for port in 5432 27017 9750 9090; do
    if ss -Hltn "sport = :$port" | grep -q .; then busy+=("$port"); fi
  done
  ((${#busy[@]} == 0)) ||
    die "port(s) ${busy[*]} already in use on this machine (ss -ltnp shows by whom); the stack runs on the host's network and needs them"
}

up() {
  need_root up
  prepare
  if daemon_running && [ -n "$(docker ps -q --filter label=com.docker.compose.project=$project)" ]; then
    die "the stack is already up (scripts/stack.sh down first)"
  fi
  check_ports
  start_daemon
  images
  compose_env
  say "docker compose --profile $profile build"
  compose build >&2 || die "docker compose build failed"
  prune
  say "docker compose --profile $profile up --wait"
  if ! compose up --detach --wait --wait-timeout 180 --no-build --pull never >&2; then
    compose ps -a >&2 || true
    compose logs --tail 30 >&2 || true
    die "docker compose up --wait failed (state and logs above; scripts/stack.sh down cleans up)"
  fi
  local bridges
  bridges=$(docker network ls --filter driver=bridge -q)
  [ -z "$bridges" ] || die "a bridge network exists after up: $bridges (every service must use network_mode: host)"
  cat <<EOF
tailrace    http://127.0.0.1:9750/api/status   (metrics: http://127.0.0.1:9750/metrics)
Prometheus  http://127.0.0.1:9090
FerretDB    mongodb://127.0.0.1:27017/   (on PostgreSQL at 127.0.0.1:5432)
docker compose with this stack: scripts/stack.sh compose ps | logs | ...   (scripts/stack.sh down stops it)
EOF
}

down() {
  need_root down
  if daemon_running; then
    compose_env
    say "docker compose down --volumes"
    compose down --volumes --remove-orphans --timeout 60 >&2 ||
      say "docker compose down failed; stopping the daemon anyway"
  fi
  stop_daemon
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  prepare) need_root prepare; prepare ;;
  compose)
    shift
    daemon_running || die "the stack's daemon is not running (scripts/stack.sh up)"
    compose_env
    compose "$@"
    ;;
  env)
    compose_env
    echo "export DOCKER_HOST=$DOCKER_HOST DOCKER_CONFIG=$DOCKER_CONFIG COMPOSE_PROFILES=$COMPOSE_PROFILES"
    ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
