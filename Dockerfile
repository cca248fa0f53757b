# syntax=docker/dockerfile:1
#
# Build: docker build -t imcanary .
# Run:   docker run --read-only -p 9464:9464 imcanary
#
# The image runs the daemon (against a reference server until a
# configuration says otherwise: mount one and pass --config). Kubernetes
# manifests are in deploy/kubernetes. cmd/imcanary/dockerfile_test.go runs
# this file's go build and checks what the image promises.

# The build runs on the builder's own platform and cross-compiles for the
# target's (TARGETOS, TARGETARCH, set by docker buildx), so a multi-arch
# image (--platform linux/amd64,linux/arm64) needs no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS TARGETARCH
# What --version, imcanary_build_info and the User-Agent report, set as
# every Prometheus exporter sets them:
#   docker build --build-arg VERSION=1.2.3 --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg BRANCH=$(git branch --show-current) .
# Left out, imcanary reports what Go recorded of the build instead; the
# build context has no .git, so that is "(devel)" and no revision.
ARG VERSION REVISION BRANCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# A static binary: the runtime image has no libc. -trimpath keeps the
# builder's paths out of the binary.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w \
      -X github.com/prometheus/common/version.Version=${VERSION} \
      -X github.com/prometheus/common/version.Revision=${REVISION} \
      -X github.com/prometheus/common/version.Branch=${BRANCH}" \
    -o /out/imcanary ./cmd/imcanary
# The runtime image has no shell to make directories with, so the data
# directory is made here, empty, and copied over with its owner.
RUN mkdir -p /out/data

# distroless static: CA certificates (for wss:// targets), tzdata (cron
# schedules in a time zone) and /etc/passwd's nonroot user, and nothing
# else: no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/imcanary /usr/local/bin/imcanary
COPY --from=build --chown=65532:65532 /out/data /var/lib/imcanary
# The run history (data_dir). The root filesystem can be read-only (docker
# run --read-only, Kubernetes readOnlyRootFilesystem): imcanary writes
# nowhere else, so this must be a writable mount, here an anonymous volume
# unless one is given. A Docker volume takes the owner of the directory
# above, so uid 65532 can write to it.
VOLUME ["/var/lib/imcanary"]
# 9464: /metrics, /healthz, /readyz and the status page.
EXPOSE 9464
# distroless's nonroot, by number: Kubernetes's runAsNonRoot can only
# verify a numeric user.
USER 65532:65532
# No shell or curl here: the binary checks itself. It exits 1 (unhealthy)
# unless http://127.0.0.1:9464/healthz answers 200; a container given
# another --http.listen needs --url in its own health check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/imcanary", "health"]
ENTRYPOINT ["/usr/local/bin/imcanary"]
# Arguments replace CMD as a whole, so whoever passes their own (as the
# Kubernetes manifests do) gives --http.listen and --data_dir again or sets
# them in the configuration file.
CMD ["run", "--http.listen=:9464", "--data_dir=/var/lib/imcanary"]
