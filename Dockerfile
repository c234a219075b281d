# syntax=docker/dockerfile:1.7
# One image per kurz service, from the repository's Go module:
#   docker build --build-arg SERVICE=limiter --build-arg VERSION=v0.1.0 -t kurz/limiter:0.1.0 .
# SERVICE is one of limiter, shortener, redirect, analytics, gateway. The
# default (last) stage is the production image: a static binary on distroless,
# as user 65532. The "dev" stage is for Tilt only (see the Tiltfile).

# ---- build: a static binary from the module ------------------------------
FROM golang:1.26.8 AS build
ARG SERVICE
WORKDIR /src
# The module files first, so the download layer is reused until they change.
COPY go.mod go.sum ./
RUN test -n "${SERVICE}" || { echo "build with --build-arg SERVICE=<limiter|shortener|redirect|analytics|gateway>" >&2; exit 1; }
RUN go mod download
# Then the sources this service can import.
COPY gen gen
COPY pkg pkg
COPY services/${SERVICE} services/${SERVICE}
# The build information kurz binaries report (pkg/buildinfo), e.g.
#   --build-arg VERSION=v0.3.0 --build-arg COMMIT=$(git rev-parse HEAD) \
#   --build-arg DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# (the context has no .git, so nothing is stamped otherwise).
ARG VERSION=dev
ARG COMMIT=
ARG DATE=
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags="-s -w -X kurz.dev/pkg/buildinfo.Version=${VERSION} -X kurz.dev/pkg/buildinfo.Commit=${COMMIT} -X kurz.dev/pkg/buildinfo.Date=${DATE}" \
      -o /out/service ./services/${SERVICE}

# ---- dev: Tilt's image, a locally cross-compiled binary that live_update
# replaces. distroless's debug variant adds busybox (sh, kill, tar) for the
# restart wrapper and Tilt's file sync; the root filesystem stays read-only, so
# new binaries land in /tmp/live (an emptyDir). Built only with --target dev.
FROM gcr.io/distroless/static-debian12:debug-nonroot AS dev
ARG SERVICE
COPY .tilt/${SERVICE}/service /app/service
COPY --chmod=0555 <<'EOF_WRAPPER' /app/restart.sh
#!/busybox/sh
# PID 1 of the dev image: runs the service, the newest binary first
# ($2 when live_update has synced one, else $1), and on SIGHUP (Tilt's
# live_update after a sync) stops it with SIGTERM, waits for its drain and
# starts it again. SIGTERM/SIGINT stop it and the wrapper exits with its status.
baked=$1
live=$2
child=
restart=
stopping=
sent=
# A signal can land between starting the service and learning its PID (the
# service may even be up and answering by then): it is remembered in
# $stopping and delivered as soon as $child is known, exactly once.
stop_child() {
  if [ -n "$child" ] && [ -z "$sent" ]; then sent=1; kill -TERM "$child" 2>/dev/null; fi
}
trap 'restart=1; stopping=1; stop_child' HUP
trap 'restart=; stopping=1; stop_child' TERM INT
while :; do
  bin=$baked
  if [ -x "$live" ]; then bin=$live; fi
  "$bin" &
  child=$!
  if [ -n "$stopping" ]; then stop_child; fi
  # Poll instead of blocking in wait: a signal landing just as wait starts
  # to block can have its trap run only when wait returns (never, for a
  # service nobody stops). A trap runs at the latest after one short sleep;
  # the shell reaps the service meanwhile and keeps its status for wait.
  while kill -0 "$child" 2>/dev/null; do
    sleep 0.2
  done
  wait "$child"
  status=$?
  if [ -z "$restart" ]; then exit "$status"; fi
  restart= stopping= sent= child=
done
EOF_WRAPPER
ENV PATH=/busybox:/usr/local/bin:/usr/bin:/bin
USER 65532:65532
ENTRYPOINT ["/busybox/sh", "/app/restart.sh", "/app/service", "/tmp/live/service"]

# ---- runtime (default): distroless static, non-root, nothing but the binary.
FROM gcr.io/distroless/static-debian12:nonroot AS runtime
COPY --from=build /out/service /app/service
USER 65532:65532
ENTRYPOINT ["/app/service"]
