# syntax=docker/dockerfile:1
# Multi-stage build. The build command is the one CI runs: cargo build --release --locked.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependency layer: build the dependencies against stub sources, so that editing src/ does not
# rebuild them.
COPY Cargo.toml Cargo.lock build.rs ./
COPY templates templates
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && echo 'fn main() {}' > benches/engine.rs \
 && cargo build --release --locked \
 && rm -rf src benches target/release/.fingerprint/sidecar-injector-*
COPY src src
COPY benches benches
RUN cargo build --release --locked

# Only the binary (the default templates are embedded in it); non-root, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/sidecar-injector /usr/local/bin/sidecar-injector
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sidecar-injector"]
CMD ["serve"]
