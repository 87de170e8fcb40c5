# The ferretdb profile's one-shot that waits for FerretDB and creates its oplog if asked
# (docker-compose.yml, ferretdb-ready): Debian's pymongo and ready.py. BASE_IMAGE:
# scripts/stack.sh builds it from a Debian image made on the machine (no registry there).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pymongo \
    && rm -rf /var/lib/apt/lists/*
COPY ready.py /usr/local/bin/ready.py
USER 65534:65534
ENTRYPOINT ["python3", "/usr/local/bin/ready.py"]
