# spawnpoint-operator and exactly what it needs to run: no shell, no package manager.
# Built by scripts/images.sh (`make images`) from the build tree: the context is the
# directory it stages (build/images/context), whose operator-root/ holds
#   usr/local/bin/spawnpoint-operator       build/bin/spawnpoint-operator, debug info stripped
#   lib/x86_64-linux-gnu/*, lib64/ld-linux-x86-64.so.2
#                                           the libraries `ldd spawnpoint-operator` lists (of
#                                           the Debian 12 machine it was built on) and the loader
#   etc/passwd, etc/group                   root and nonroot (65532)
#   etc/ssl/certs/ca-certificates.crt       for API servers behind publicly signed certificates
#                                           (and usr/lib/ssl/cert.pem, certs: OpenSSL's defaults)
#   tmp/                                    mode 1777 (the chart mounts an emptyDir there)
# with docker build when a Docker engine runs, else with buildah (images/README.md).
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=https://example.invalid/spawnpoint
ARG LICENSES=Apache-2.0
LABEL org.opencontainers.image.title="spawnpoint-operator" \
      org.opencontainers.image.description="The spawnpoint operator: TrainingJobs (spawnpoint.dev/v1alpha1) into gangs of pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="${LICENSES}"
COPY operator-root/ /
# Non-root, numeric (so runAsNonRoot can verify it); the default ports (:8080 metrics,
# :8081 health) need no privilege.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/spawnpoint-operator"]
