#!/usr/bin/env bash
# FerretDB (a MongoDB wire-protocol server on SQLite or PostgreSQL) for the MongoDB engine's tests.
#
#   scripts/ferretdb.sh install   build FerretDB into the cache (skipped when that version is there)
#   scripts/ferretdb.sh start     install if needed, start it on a free loopback port, print the URI
#   scripts/ferretdb.sh uri       print the URI of the running server
#   scripts/ferretdb.sh bin       print the path of the server binary (tests start their own)
#   scripts/ferretdb.sh postgresql  print the PostgreSQL server's URL (TAILRACE_FERRETDB_BACKEND=postgresql)
#   scripts/ferretdb.sh stop      stop it and remove its data
#
# The server runs with its SQLite backend in $TAILRACE_FERRETDB_HOME (default: a directory under
# $TMPDIR named after the user), or with TAILRACE_FERRETDB_BACKEND=postgresql on a PostgreSQL
# server of its own (Debian's `postgresql` package; initdb'd there, on another free loopback port,
# with config/ferretdb/index-ids.sql applied as the compose stack does), with --repl-set-name
# so that drivers see a replica set, and with
# `local.oplog.rs` created (FerretDB's oplog is a capped collection the client makes). It sends
# nothing off this machine: telemetry is disabled (flag and DO_NOT_TRACK) and its debug HTTP
# listener is off; it listens on 127.0.0.1 only.
#
# Why not `go install github.com/FerretDB/FerretDB/cmd/ferretdb@v1.24.2`: a binary built that
# way panics at start ("Invalid build/version/version.txt file content"), because the module
# as published lacks the version file its own build writes. So the module is downloaded with
# `go mod download`, the file is written as FerretDB's docs say, and `go build` builds it.
set -euo pipefail

version=v1.24.2
# pymongo: the client that creates the oplog and checks the server answers.
pymongo_version=4.20.1
cache=${XDG_CACHE_HOME:-$HOME/.cache}/tailrace/ferretdb
bin=$cache/$version/ferretdb
home=${TAILRACE_FERRETDB_HOME:-${TMPDIR:-/tmp}/tailrace-ferretdb-$(id -u)}
backend=${TAILRACE_FERRETDB_BACKEND:-sqlite}
here=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "ferretdb.sh: $*" >&2; exit 1; }

install() {
  [ -x "$bin" ] && return 0
  command -v go >/dev/null 2>&1 || die "go is not installed (FerretDB is built from the Go module proxy)"
  echo "ferretdb.sh: building FerretDB $version into $bin (about 2-3 minutes)" >&2
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
  local src work
  src=$(go mod download -json "github.com/FerretDB/FerretDB@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') ||
    die "go mod download github.com/FerretDB/FerretDB@$version failed (is the Go module proxy reachable?)"
  work=$(mktemp -d)
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  echo "$version" > "$work/build/version/version.txt"
  mkdir -p "$(dirname "$bin")"
  if ! (cd "$work" && go build -trimpath -o "$bin.tmp" ./cmd/ferretdb); then
    rm -rf "$work"
    die "go build of FerretDB $version failed"
  fi
  rm -rf "$work"
  mv "$bin.tmp" "$bin"
}

venv() {
  local py=$cache/venv/bin/python
  if ! "$py" -c "import pymongo, sys; sys.exit(pymongo.version != '$pymongo_version')" 2>/dev/null; then
    echo "ferretdb.sh: pymongo $pymongo_version -> $cache/venv" >&2
    rm -rf "$cache/venv"
    python3 -m venv "$cache/venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$cache/venv/bin/pip" install --quiet --disable-pip-version-check "pymongo==$pymongo_version" ||
      die "pip install pymongo==$pymongo_version failed"
  fi
  echo "$py"
}

running() { [ -f "$home/pid" ] && kill -0 "$(cat "$home/pid")" 2>/dev/null; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# PostgreSQL refuses to run as root: as root, its files belong to Debian's `postgres` user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# Starts a PostgreSQL server in $home/pg on a free loopback port (trust authentication, for
# loopback tests only) with a database `ferretdb`; prints its URL.
start_postgresql() {
  local pgbin port
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -x "$pgbin/initdb" ] || die "PostgreSQL is not installed (Debian: apt-get install postgresql)"
  port=$(free_port)
  mkdir -p "$home/pg"
  [ "$(id -u)" = 0 ] && chown postgres: "$home/pg"
  as_pg "$pgbin/initdb" -D "$home/pg/data" --username=ferretdb --auth=trust --encoding=UTF8 \
    --locale=C.UTF-8 >"$home/pg/initdb.log" 2>&1 || { cat "$home/pg/initdb.log" >&2; die "initdb failed"; }
  as_pg "$pgbin/pg_ctl" -D "$home/pg/data" -l "$home/pg/log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $home/pg" start >/dev/null ||
    { tail -n 20 "$home/pg/log" >&2; die "PostgreSQL did not start"; }
  echo "$pgbin" > "$home/pg/bin"
  # `tailrace_template`, with the stack's index trigger, is what every database here copies:
  # `ferretdb` for this server, and one per server that tailrace/tests/ferretdb.rs starts.
  "$pgbin/createdb" --host=127.0.0.1 --port="$port" --username=ferretdb tailrace_template
  PGOPTIONS="-c client_min_messages=warning" "$pgbin/psql" --quiet --no-psqlrc --set ON_ERROR_STOP=1 \
    --host=127.0.0.1 --port="$port" --username=ferretdb --dbname=tailrace_template \
    --file="$here/config/ferretdb/index-ids.sql" >/dev/null
  "$pgbin/createdb" --host=127.0.0.1 --port="$port" --username=ferretdb --template=tailrace_template ferretdb
  echo "postgres://ferretdb@127.0.0.1:$port" > "$home/pg/url"
}

stop_postgresql() {
  [ -f "$home/pg/bin" ] && [ -d "$home/pg/data" ] || return 0
  as_pg "$(cat "$home/pg/bin")/pg_ctl" -D "$home/pg/data" -m fast -w stop >/dev/null 2>&1 || true
}

start() {
  if running; then cat "$home/uri"; return 0; fi
  install
  local py port
  py=$(venv)
  rm -rf "$home"
  mkdir -p "$home/data" "$home/state"
  port=$(free_port)
  local handler
  case "$backend" in
    sqlite) handler=(--handler=sqlite --sqlite-url="file:$home/data/") ;;
    postgresql)
      start_postgresql
      handler=(--handler=postgresql --postgresql-url="$(cat "$home/pg/url")/ferretdb")
      ;;
    *) die "TAILRACE_FERRETDB_BACKEND=$backend: use sqlite or postgresql" ;;
  esac
  DO_NOT_TRACK=1 nohup "$bin" \
    "${handler[@]}" \
    --listen-addr="127.0.0.1:$port" --state-dir="$home/state" \
    --repl-set-name=rs0 --debug-addr=- --telemetry=disable --log-level=warn \
    >"$home/log" 2>&1 &
  echo $! > "$home/pid"
  local uri="mongodb://127.0.0.1:$port/?replicaSet=rs0"
  # Waits for `ping`, then creates the oplog FerretDB writes once it exists: the compose
  # stack's one-shot, asked for the oplog (its messages to stderr: stdout is the URI).
  if ! FERRETDB_OPLOG=true "$py" "$here/config/ferretdb/ready.py" "$uri" >&2; then
    tail -n 20 "$home/log" >&2
    stop
    die "FerretDB did not start (its log is above)"
  fi
  echo "$uri" > "$home/uri"
  echo "$uri"
}

stop() {
  if running; then
    local pid
    pid=$(cat "$home/pid")
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  stop_postgresql
  rm -rf "$home"
}

case "${1:-}" in
  install) install; echo "$bin" ;;
  start) start ;;
  uri) running || die "not running (scripts/ferretdb.sh start)"; cat "$home/uri" ;;
  bin) install; echo "$bin" ;;
  postgresql) [ -f "$home/pg/url" ] || die "no PostgreSQL running (TAILRACE_FERRETDB_BACKEND=postgresql scripts/ferretdb.sh start)"; cat "$home/pg/url" ;;
  stop) stop ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
