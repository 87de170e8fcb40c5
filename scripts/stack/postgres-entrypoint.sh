#!/bin/sh
# The official postgres image's start, reduced to what the stack uses: on an empty data
# directory, initdb with POSTGRES_USER/POSTGRES_PASSWORD (scram-sha-256 over TCP), create
# POSTGRES_DB and run the SQL files in /docker-entrypoint-initdb.d; then run the server in the
# foreground on 127.0.0.1.
set -eu
: "${POSTGRES_USER:?set POSTGRES_USER}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
db=${POSTGRES_DB:-$POSTGRES_USER}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
  initdb --username="$POSTGRES_USER" --pwfile="$pw" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
  rm -f "$pw"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$db" != postgres ]; then createdb --username="$POSTGRES_USER" "$db"; fi
  # As the official image does: the *.sql files mounted for the first start, in name order.
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] || continue
    psql --quiet --no-psqlrc --set ON_ERROR_STOP=1 --username="$POSTGRES_USER" --dbname="$db" \
      --file="$f" >/dev/null
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses=127.0.0.1 "$@"
