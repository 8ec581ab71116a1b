# spawnpoint-agent, as the self-contained bundle (agent/bundle/make-bundle.sh) in
# /opt/spawnpoint, on a base that holds nothing but a static busybox. Built by
# scripts/images.sh (`make images`) from the build tree: the context is the directory it
# stages (build/images/context: agent-bundle/ is build/agent-bundle/), with docker build
# when a Docker engine runs, else with buildah (images/README.md).
#
# The operator's init container runs `cp -R /opt/spawnpoint/. /spawnpoint/` from this image
# into an emptyDir, and the trainer container (any user image: Ubuntu, UBI, distroless, or
# one with no libc at all) runs /spawnpoint/bin/spawnpoint-agent, a static launcher that
# loads the agent with the bundle's own glibc and libraries. The base gives the init
# container its cp (busybox); nothing of it reaches the trainer pod.
#
# BASE_IMAGE: busybox from a registry when one is reachable; otherwise scripts/images.sh
# makes one from Debian 12's busybox-static with mmdebstrap (scripts/foreign-root.sh
# bookworm-busybox) and passes its local name, localhost/spawnpoint/busybox:bookworm.
ARG BASE_IMAGE=docker.io/library/busybox:1.36.1-musl
FROM ${BASE_IMAGE}
# Declared again: an ARG before FROM is not seen after it.
ARG BASE_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=https://example.invalid/spawnpoint
ARG LICENSES=Apache-2.0
LABEL org.opencontainers.image.title="spawnpoint-agent" \
      org.opencontainers.image.description="The spawnpoint node agent as a self-contained bundle in /opt/spawnpoint, copied into training pods by an init container" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="${LICENSES}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
COPY agent-bundle/ /opt/spawnpoint/
# Non-root, numeric (so runAsNonRoot can verify it): the init container copies as 65532.
USER 65532:65532
ENTRYPOINT ["/opt/spawnpoint/bin/spawnpoint-agent"]
CMD ["--help"]
