# FerretDB 1.24.2 for scripts/stack.sh, in place of ghcr.io/ferretdb/ferretdb:1.24.2 (no image
# registry on our machines): the binary scripts/ferretdb.sh builds from the Go module proxy
# (the build context is its cache directory), listening on 127.0.0.1 only, debug HTTP off.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY ferretdb /ferretdb
ENV FERRETDB_LISTEN_ADDR=127.0.0.1:27017 FERRETDB_DEBUG_ADDR=- FERRETDB_STATE_DIR=/state
RUN mkdir /state && chown 65534:65534 /state
USER 65534:65534
ENTRYPOINT ["/ferretdb"]
