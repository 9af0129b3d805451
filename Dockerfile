# syntax=docker/dockerfile:1
# Multi-stage build. The build command is the one CI runs: cargo build --release --locked.

FROM rust:1.95-bookworm AS build
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
 && cargo build --release --locked \
 && rm -rf src crates/engine/src target/release/.fingerprint/sidecar-injector-*
COPY crates/engine/src crates/engine/src
COPY src src
RUN cargo build --release --locked

# Only the binary (the default templates are embedded in it); non-root, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/sidecar-injector /usr/local/bin/sidecar-injector
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sidecar-injector"]
CMD ["serve"]
