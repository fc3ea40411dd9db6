# syntax=docker/dockerfile:1
# Throttle's image: a release build on the project's toolchain (rustc 1.95.0), then a slim
# Debian runtime with the binary, the shipped gateway.toml and a non-root user (uid 10001).
#
#   docker build -t throttle:local .
#   docker run --rm throttle:local check            # validates /etc/throttle/gateway.toml
#   docker run --rm -p 8080:8080 -p 127.0.0.1:9090:9090 \
#     -v "$PWD/my-gateway.toml:/etc/throttle/gateway.toml:ro" throttle:local
#
# The shipped gateway.toml listens on 127.0.0.1, which inside a container answers only the
# container itself: mount a config that listens on 0.0.0.0, as docker-compose.yml and
# deploy/kubernetes/ do. CI cannot run Docker; .ci/image-steps runs this file's build
# command and checks the binary against what the runtime stage provides.

FROM rust:1.95.0-slim-bookworm AS builder
# The slim image has gcc and libc6-dev; Pingora's zlib-ng build (libz-ng-sys) also runs
# cmake, which drives make. .cargo/cmake uses the cmake on PATH, so nothing comes from PyPI.
# Debian's versions are not pinned: bookworm's archive drops superseded ones.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The crate registry and target/ are BuildKit caches, so a rebuild after a source change
# compiles only throttle itself, not its dependencies. The binary leaves the cache in the
# same step (the cache is not part of the image), without its DWARF line tables
# ([profile.release] debug = 1: ~185 MB with them, ~29 MB without; the symbols stay, so
# a backtrace still names its functions).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin throttle \
 && strip --strip-debug -o /usr/local/bin/throttle target/release/throttle

FROM debian:bookworm-slim
# ca-certificates: the system roots for rediss:// and an https jwks_url (rustls-native-certs).
# The binary needs nothing else: glibc, libm and libgcc_s are in the base image.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 throttle \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin throttle
COPY --from=builder /usr/local/bin/throttle /usr/local/bin/throttle
COPY gateway.toml /etc/throttle/gateway.toml
# `throttle check`, `migrate` and `keys` read the same file without --config.
ENV THROTTLE_CONFIG=/etc/throttle/gateway.toml
USER 10001:10001
# 8080: the proxy listener; 9090: the admin API (/healthz, /readyz, /metrics).
EXPOSE 8080 9090
ENTRYPOINT ["throttle"]
CMD ["run", "--config", "/etc/throttle/gateway.toml"]
