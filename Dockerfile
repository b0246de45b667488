# fenced in a container (docs/operations.md, "Packaging").
#
#   docker build -t fenced .
#   docker run -d --name fenced -p 7379:7379 -p 7380:7380 -v fenced-data:/var/lib/fenced fenced
#
# Arguments after the image name replace the default --grpc-addr below (a cluster member
# must serve at the address --initial-cluster gives it, see docs/operations.md).

# Stage 1: build. protoc comes from the protoc-bin-vendored crate and the C parts (Lua,
# mimalloc, ring) build with the image's gcc, so nothing needs installing. Pin a toolchain
# with --build-arg RUST_IMAGE=rust:1.95-bookworm.
ARG RUST_IMAGE=rust:bookworm
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin fenced

# Stage 2: the binary alone (it links only glibc, libm and libgcc_s) on the same Debian.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/fenced \
        --shell /usr/sbin/nologin fenced \
    && install -d -o fenced -g fenced -m 0700 /var/lib/fenced
COPY --from=build /src/target/release/fenced /usr/local/bin/fenced
USER fenced
EXPOSE 7379 7380
VOLUME /var/lib/fenced
# SIGTERM (docker stop) shuts the node down cleanly.
STOPSIGNAL SIGTERM
ENTRYPOINT ["fenced", "serve", "--data-dir", "/var/lib/fenced", "--resp-addr", "0.0.0.0:7379"]
# gRPC on every interface: right for a single node. A member of a multi-node cluster gets
# instead the --grpc-addr its --initial-cluster entry names (peers refuse any other).
CMD ["--grpc-addr", "0.0.0.0:7380"]
