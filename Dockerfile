# tailrace with the MongoDB engine. `docker compose up` builds it (see docker-compose.yml); by
# hand: `docker build -t tailrace .`. Checked without Docker by tailrace/tests/stack.rs (copied
# paths, crate, binary and feature names, hadolint); built and run by scripts/stack.sh.
#
# Two build arguments let a machine without an image registry build the same runtime stage:
# RUNTIME_IMAGE, the Debian image it starts from, and BINARY_FROM, an image holding a release
# binary at /usr/local/bin/tailrace built outside Docker (then the build stage is skipped).
# scripts/stack.sh passes both; by default the binary is built from source below. No
# `# syntax=` line: the builder built into Docker parses this file, so that no frontend image
# has to be pulled.
ARG RUNTIME_IMAGE=debian:trixie-slim
ARG BINARY_FROM=build

# ---- build ------------------------------------------------------------------------------------
# The same Debian release as the runtime stage, so the binary finds the glibc it was linked with.
FROM rust:1.95-slim-trixie AS build
WORKDIR /src
# The workspace manifest, the lock file and every member crate (plus the reference config, which
# the sources may embed): nothing else is needed to build.
COPY Cargo.toml Cargo.lock ./
COPY store ./store
COPY feeds ./feeds
COPY ingest ./ingest
COPY server ./server
COPY bench ./bench
COPY tailrace ./tailrace
COPY config/tailrace.toml ./config/tailrace.toml
# Cache mounts keep the registry and compiled dependencies between builds (BuildKit, the default
# builder of current Docker); the binary is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features ingest/mongodb --bin tailrace \
    && cp target/release/tailrace /usr/local/bin/tailrace

# The binary: the build stage's, or the image named by BINARY_FROM.
FROM ${BINARY_FROM} AS binary

# ---- run --------------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
# ca-certificates: TLS to MongoDB (Atlas, mongodb+srv://) and HTTPS sources. curl: the health
# check. Versions are not pinned: Debian's archive keeps only the current security release of
# each package, so a pin would break the build at the next update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
# An unprivileged user; its home holds the embedded engine's data if that engine is chosen.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/tailrace tailrace
COPY --from=binary /usr/local/bin/tailrace /usr/local/bin/tailrace
# Numeric, so that "run as non-root" checks (Kubernetes runAsNonRoot) can verify it.
USER 10001:10001
WORKDIR /var/lib/tailrace
# In a container the HTTP server must listen beyond loopback; compose publishes the port on
# 127.0.0.1 only.
ENV TAILRACE_HTTP__LISTEN=0.0.0.0:9750
EXPOSE 9750
# /healthz answers as soon as the HTTP server runs.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["curl", "--fail", "--silent", "--show-error", "--max-time", "2", "http://127.0.0.1:9750/healthz"]
# SIGTERM stops the sources, flushes the writer and checkpoints the feeds, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tailrace"]
CMD ["run"]
