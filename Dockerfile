# idemgw as a sidecar container (docker or podman). Configured by IDEMGW_* variables alone;
# conf/idemgw.yaml is the default config file and documents every setting.
#   podman build -t idemgw .            (--build-arg BASE=... to build on another Debian 12 base,
#                                        e.g. one made with debootstrap: see docs/deployment.md)
#   podman run --ulimit nofile=16384:16384 --ulimit nproc=4096:4096 -e IDEMGW_UPSTREAM=http://127.0.0.1:3001/mcp \
#       -e IDEMGW_LISTEN=127.0.0.1:8080 -e IDEMGW_ADMIN_LISTEN=127.0.0.1:8081 --network host idemgw
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential pkg-config node-llhttp libevent-dev libjansson-dev libfyaml-dev \
      libpq-dev libssl-dev zlib1g-dev libbrotli-dev libsqlite3-dev
WORKDIR /src
COPY Makefile ./
COPY src src
COPY include include
COPY sql sql
COPY scripts/embed-sql.sh scripts/
RUN make -j"$(nproc)" && strip build/idemgw

FROM ${BASE}
# The runtime libraries of the binary and the CA bundle, nothing else: no compiler, no apt lists.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libevent-2.1-7 libevent-openssl-2.1-7 libjansson4 libfyaml0 libpq5 libssl3 zlib1g \
      libbrotli1 libsqlite3-0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt /var/log/dpkg.log
COPY --from=build /src/build/idemgw /usr/bin/idemgw
COPY conf/idemgw.yaml /etc/idemgw/idemgw.yaml
# State of the embedded store (one replica) lives in the one volume; the root may be read-only.
VOLUME /var/lib/idemgw
ENV STATE_DIRECTORY=/var/lib/idemgw \
    IDEMGW_LISTEN=0.0.0.0:8080 \
    IDEMGW_ADMIN_LISTEN=0.0.0.0:8081
USER 65532:65532
EXPOSE 8080 8081
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=4s --start-period=5s --retries=3 CMD ["/usr/bin/idemgw", "health"]
ENTRYPOINT ["/usr/bin/idemgw"]
