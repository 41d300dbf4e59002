# syntax=docker/dockerfile:1
# Spillway image. Build: docker build -t spillway .
# Run:  docker run --rm -p 8000:8000 -p 127.0.0.1:9090:9090 \
#         --security-opt seccomp=tuning/seccomp-io_uring.json --ulimit memlock=-1 \
#         -v "$PWD/my.toml:/etc/spillway/spillway.toml:ro" spillway
# Seccomp, memlock and the I/O driver in containers: tuning/README.md.

# Assumed tag: the official Rust image at Cargo.toml's rust-version (1.95) on Debian bookworm.
# Not pulled here (no Docker engine where this file was written). Bookworm in both stages, so the
# binary runs against the glibc it was linked with.
FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src

# Dependency layer: build the locked dependencies against stub sources, so a change to
# Spillway's own code does not rebuild them. Cargo loads every workspace member's manifest,
# so each member gets one here (.ci/docker-stages replays these steps in CI).
COPY Cargo.toml Cargo.lock ./
COPY .cargo/ .cargo/
COPY mock/Cargo.toml mock/
COPY testkit/Cargo.toml testkit/
COPY bench/forward/Cargo.toml bench/forward/
RUN mkdir -p src mock/src testkit/src bench/forward/src \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > bench/forward/src/main.rs \
 && touch src/lib.rs mock/src/lib.rs testkit/src/lib.rs \
 && cargo build --release --locked --bin spillway \
 && rm -rf src mock/src testkit/src bench/forward/src

# The release build CI runs. COPY keeps the files' modification times, older than the stubs'
# build: touch the crate roots or cargo keeps the stub binary.
COPY . .
RUN touch src/main.rs src/lib.rs mock/src/lib.rs \
 && cargo build --release --locked --bin spillway

FROM debian:bookworm-slim
# Unpinned: bookworm's point and security releases drop superseded versions from the archive, so
# a pinned version stops installing; the base image tag fixes the Debian release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin spillway

COPY --from=builder /src/target/release/spillway /usr/local/bin/spillway
# Default config: listens on 0.0.0.0 (tuning/spillway.toml's 127.0.0.1 is unreachable through a
# published port). Mount your own file over it.
COPY tuning/docker/spillway.toml /etc/spillway/spillway.toml

# Numeric, so Kubernetes runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 8000 9090
STOPSIGNAL SIGTERM
# No curl in slim images and no probe subcommand in spillway: bash (always in Debian) speaks
# HTTP/1.1 over /dev/tcp. Probes the admin listener of the shipped config; change the port here
# if your config moves admin_listen.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /live HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && read -r status <&3 && [[ $status == 'HTTP/1.1 200 '* ]]"]
ENTRYPOINT ["spillway"]
CMD ["--config", "/etc/spillway/spillway.toml"]
