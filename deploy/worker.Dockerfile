# The Tandem worker image for workers.yaml. Not built in CI (the checks run no container
# builds); the manifests only name the image.
#   docker build -f deploy/worker.Dockerfile -t tandem-worker:latest .
# --backend cuda loads the NVIDIA driver (mounted by the device plugin) and NVRTC
# (libnvrtc.so.13, in the CUDA runtime image) at run time; nothing CUDA is needed to build.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p tandem-cli --bin tandem

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
COPY --from=build /src/target/release/tandem /usr/local/bin/tandem
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/tandem"]
