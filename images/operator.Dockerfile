# spawnpoint-operator. Build from the repository root:
#   docker build -f images/operator.Dockerfile -t ghcr.io/spawnpoint/operator:dev .
#
# Stage 1 builds on Debian 12 with the project's own dependency script (the same packages
# as a developer machine: configuring the tree needs GTest and libtorch even though only
# the operator is built). Keep it identical to agent.Dockerfile's so the two share cache.
FROM debian:12 AS build
ARG JOBS=4
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
 && ninja -C build -j "${JOBS}" spawnpoint-operator \
 && objcopy --strip-debug build/bin/spawnpoint-operator

# Stage 2: the operator and only its runtime libraries (`ldd spawnpoint-operator`:
# libcpprest2.10 brings libssl3, libbrotli1 and zlib1g; libstdc++6, libgcc-s1 and libc6 are
# in the slim base). ca-certificates for API servers behind publicly signed certificates.
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libcpprest2.10 libyaml-cpp0.7 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/spawnpoint-operator /usr/local/bin/spawnpoint-operator
# Non-root, numeric (so runAsNonRoot can verify it); the default ports (:8080 metrics,
# :8081 health) need no privilege.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/spawnpoint-operator"]
