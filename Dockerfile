# syntax=docker/dockerfile:1
# Multi-stage, multi-platform build (linux/amd64 and linux/arm64). The build stage runs on the
# builder's own platform and cross-compiles for the image's (TARGETARCH): an arm64 image is built at
# native speed on amd64 and the other way round, never under emulation. The build command is the one
# CI runs, `cargo build --release --locked`, for the target's triple and through cargo-auditable, so
# the binary carries the list of the crates it links. `make image` builds this file with BuildKit.

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH
# Debian's cross C toolchains name their compilers so (ring's C code, and the linker).
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc
# The target's Rust standard library and, when the target is not the builder's architecture,
# Debian's C cross toolchain for it; the Rust target triple is kept in /rust-target.
RUN set -eu; \
    case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-gnu gcc=gcc-x86-64-linux-gnu ;; \
      arm64) target=aarch64-unknown-linux-gnu gcc=gcc-aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH=$TARGETARCH (amd64 or arm64)" >&2; exit 1 ;; \
    esac; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      apt-get update -qq && apt-get install -y -qq --no-install-recommends "$gcc" "libc6-dev-$TARGETARCH-cross" \
      && rm -rf /var/lib/apt/lists/*; \
    fi; \
    rustup target add "$target"; \
    echo "$target" > /rust-target
RUN cargo install --locked --quiet cargo-auditable@0.7.7
WORKDIR /src
# Dependency layer: build the dependencies against stub sources, so that editing src/ does not
# rebuild them. Cargo validates every target the manifest declares, so the benches and the e2e test
# get stubs too (they are never built here).
COPY Cargo.toml Cargo.lock ./
COPY crates/engine/Cargo.toml crates/engine/build.rs crates/engine/
COPY templates templates
RUN mkdir -p src benches tests/e2e tests/node_e2e crates/engine/src crates/engine/benches \
 && for target in src/main.rs benches/server.rs tests/e2e/main.rs tests/node_e2e/main.rs crates/engine/benches/engine.rs; do echo 'fn main() {}' > "$target"; done \
 && touch src/lib.rs crates/engine/src/lib.rs \
 && cargo auditable build --release --locked --target "$(cat /rust-target)" \
 && rm -rf src crates/engine/src target/release/.fingerprint/sidecar-injector-* target/*/release/.fingerprint/sidecar-injector-*
COPY crates/engine/src crates/engine/src
COPY src src
# The binary is left where a native build puts it, whatever the target.
RUN cargo auditable build --release --locked --target "$(cat /rust-target)" \
 && mkdir -p target/release && cp "target/$(cat /rust-target)/release/sidecar-injector" target/release/

# Only the binary (the default templates are embedded in it); non-root, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/sidecar-injector /usr/local/bin/sidecar-injector
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sidecar-injector"]
CMD ["serve"]
