# syntax=docker/dockerfile:1
# pagoda's container image: pagoda-server with pagoda-cli and pagoda-bench beside it.
#   docker build -t pagoda:0.1.0 .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 pagoda:0.1.0
# Settings are the server's flags as PAGODA_* variables (docker run -e PAGODA_KV_HEADS=8 ...)
# or flags after the image name. The build stage runs the same scripts/install-deps.sh
# and `make build` CI runs; scripts/check-deploy.sh checks the flags used here
# against pagoda-server --help.

# The toolkit CI compiles with (nvcc 13.0.88); -devel to build, -runtime to run.
# The bases are build arguments: `make image-test` builds a CPU image of this
# same file on a local Debian base (PAGODA_CUDA=OFF), since the CUDA bases
# cannot be pulled everywhere.
ARG CUDA_IMAGE_VERSION=13.0.2
ARG UBUNTU_VERSION=ubuntu24.04
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_IMAGE_VERSION}-devel-${UBUNTU_VERSION}
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_IMAGE_VERSION}-runtime-${UBUNTU_VERSION}

FROM ${BUILD_IMAGE} AS build
# ON: the CUDA backend is required (the default); OFF: a CPU-only image.
ARG PAGODA_CUDA=ON
WORKDIR /src
# The package list first, so the dependency layer is cached across source changes.
# Only the compile group: the test suite's packages (gtest, torch, ...) stay out.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh compile && rm -rf /var/lib/apt/lists/*
COPY . .
# The Makefile's own build target, as `make test` in CI runs it.
RUN make build BUILD=build DEPS_GROUPS=compile \
      CMAKE_FLAGS='-DPAGODA_CUDA='"${PAGODA_CUDA}"' -DCMAKE_CUDA_ARCHITECTURES="90a;80" -DPAGODA_BUILD_TESTS=OFF' \
 && mkdir -p /out/bin \
 && cp build/server/pagoda-server build/client/pagoda-cli build/client/pagoda-bench /out/bin/ \
 && bash scripts/runtime-packages.sh /out/bin/* > /out/runtime-packages.txt

FROM ${RUNTIME_IMAGE}
# Only the packages whose libraries the binaries load (listed by the build stage).
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin pagoda
COPY --from=build /out/bin/ /usr/local/bin/

USER 10001:10001
ENV PAGODA_LISTEN=0.0.0.0:50051 \
    PAGODA_METRICS_ADDRESS=0.0.0.0:9464 \
    PAGODA_LOG_FORMAT=json
EXPOSE 50051 9464
# grpc.health.v1 through pagoda-cli, on the port PAGODA_LISTEN names; start-up
# includes CUDA initialisation and the cache allocation.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD pagoda-cli --server "127.0.0.1:${PAGODA_LISTEN##*:}" --timeout-ms 2000 health
ENTRYPOINT ["pagoda-server"]
