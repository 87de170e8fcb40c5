#!/usr/bin/env bash
# FerretDB (a MongoDB wire-protocol server on SQLite) for the MongoDB engine's tests.
#
#   scripts/ferretdb.sh install   build FerretDB into the cache (skipped when that version is there)
#   scripts/ferretdb.sh start     install if needed, start it on a free loopback port, print the URI
#   scripts/ferretdb.sh uri       print the URI of the running server
#   scripts/ferretdb.sh bin       print the path of the server binary (tests start their own)
#   scripts/ferretdb.sh stop      stop it and remove its data
#
# The server runs with its SQLite backend in $TAILRACE_FERRETDB_HOME (default: a directory under
# $TMPDIR named after the user), with --repl-set-name so that drivers see a replica set, and with
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

start() {
  if running; then cat "$home/uri"; return 0; fi
  install
  local py port
  py=$(venv)
  rm -rf "$home"
  mkdir -p "$home/data" "$home/state"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  DO_NOT_TRACK=1 nohup "$bin" \
    --handler=sqlite --sqlite-url="file:$home/data/" \
    --listen-addr="127.0.0.1:$port" --state-dir="$home/state" \
    --repl-set-name=rs0 --debug-addr=- --telemetry=disable --log-level=warn \
    >"$home/log" 2>&1 &
  echo $! > "$home/pid"
  local uri="mongodb://127.0.0.1:$port/?replicaSet=rs0"
  # Waits for `ping` (up to 30 s), then creates the oplog FerretDB writes once it exists.
  if ! "$py" - "$uri" <<'PY'
import sys, time
from pymongo import MongoClient
from pymongo.errors import CollectionInvalid, PyMongoError
client = MongoClient(sys.argv[1], serverSelectionTimeoutMS=1000)
deadline = time.monotonic() + 30
while True:
    try:
        client.admin.command("ping")
        break
    except PyMongoError as e:
        if time.monotonic() > deadline:
            sys.exit(f"no answer to ping within 30 s: {e}")
        time.sleep(0.2)
try:
    client.local.create_collection("oplog.rs", capped=True, size=256 * 1024 * 1024, max=10000)
except CollectionInvalid:
    pass
PY
  then
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
  rm -rf "$home"
}

case "${1:-}" in
  install) install; echo "$bin" ;;
  start) start ;;
  uri) running || die "not running (scripts/ferretdb.sh start)"; cat "$home/uri" ;;
  bin) install; echo "$bin" ;;
  stop) stop ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
