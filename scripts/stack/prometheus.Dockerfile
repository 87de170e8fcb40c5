# Prometheus from Debian (2.42) for scripts/stack.sh, in place of prom/prometheus that
# docker-compose.yml names (no image registry on our machines): the same entry point and
# storage path (/prometheus), listening on 127.0.0.1 only.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus \
    && chown 65534:65534 /prometheus
# nobody, as in the official image.
USER 65534:65534
ENTRYPOINT ["/usr/bin/prometheus", "--web.listen-address=127.0.0.1:9090"]
