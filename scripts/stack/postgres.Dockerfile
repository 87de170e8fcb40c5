# PostgreSQL 15 from Debian for scripts/stack.sh (no image registry on our machines), in place
# of the official postgres:15 image that docker-compose.yml names: the same environment
# (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB), data directory and pg_isready health check,
# but listening on 127.0.0.1 only (the stack runs on the host's network).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The postgres user first, with the official image's uid, so that USER can be numeric.
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 postgres \
    && useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql postgres \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data \
    && chown postgres:postgres /var/lib/postgresql/data \
    && chmod 0700 /var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER 999:999
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
