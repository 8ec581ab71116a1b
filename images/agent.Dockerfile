# spawnpoint-agent, as the self-contained bundle (agent/bundle/make-bundle.sh) in
# /opt/spawnpoint. Build from the repository root:
#   docker build -f images/agent.Dockerfile -t ghcr.io/spawnpoint/agent:dev .
#
# The operator's init container runs `cp -R /opt/spawnpoint/. /spawnpoint/` from this image
# into an emptyDir, and the trainer container (any user image: Ubuntu, UBI, distroless)
# runs /spawnpoint/bin/spawnpoint-agent, a static launcher that loads the agent with the
# bundle's own glibc and libraries.
#
# Stage 1: identical to operator.Dockerfile's build stage, so the two share cache.
FROM debian:12 AS build
ARG JOBS=4
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
 && ninja -C build -j "${JOBS}" agent-bundle

# Stage 2: only the bundle. debian:12-slim rather than scratch because the init container
# needs cp; nothing of this image's /usr reaches the trainer pod.
FROM debian:12-slim
COPY --from=build /src/build/agent-bundle/ /opt/spawnpoint/
USER 65532:65532
ENTRYPOINT ["/opt/spawnpoint/bin/spawnpoint-agent"]
CMD ["--help"]
