# Multi-stage build for machines with internet access: `docker compose build` (or
# `docker build -t gateway:latest .`). One image holds all four binaries; each compose service
# picks its binary through the command. Offline, scripts/build-images makes the same image from
# host-built binaries on a debootstrapped base (docker/Dockerfile.offline).

# ---- builder -------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src
# Protobuf is compiled by protox (pure Rust) and SQLite is bundled: nothing to apt-get here.
COPY . .
# The `production` profile: whole-program optimisation, one code-generation unit (Cargo.toml).
RUN cargo build --profile production --locked --features data-plane/jemalloc \
      --bin control-plane --bin data-plane --bin auth-service --bin mock-service \
 && mkdir -p /out \
 && cp target/production/control-plane target/production/data-plane \
       target/production/auth-service target/production/mock-service /out/

# ---- runtime -------------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 gateway \
 && useradd --uid 10001 --gid gateway --no-create-home --home-dir /var/lib/gateway --shell /usr/sbin/nologin gateway \
 && install -d -o gateway -g gateway -m 0750 /var/lib/gateway /var/cache/gateway \
 && install -d -o gateway -g gateway -m 0700 /run/gateway \
 && install -d -o gateway -g gateway -m 0755 /var/lib/gateway-ca
COPY docker/entrypoint.sh /usr/local/bin/gateway-entrypoint
COPY docker/http-probe /usr/local/bin/http-probe
COPY --from=builder /out/ /usr/local/bin/
# Non-root: nothing in the stack needs a privileged port or capability.
USER gateway
WORKDIR /var/lib/gateway
ENTRYPOINT ["gateway-entrypoint"]
CMD ["data-plane", "--help"]
