# syntax=docker/dockerfile:1
# streamlease worker image: `docker build -t streamlease:$(git describe --tags --always) .`
#
# Two stages. The build stage downloads every wheel requirements.lock pins, checking
# each against the lock's sha256 hashes, builds the project's own wheel offline against
# that wheelhouse (the build backend comes from the lock too), and installs the project
# into /opt/venv from the wheelhouse alone: only the runtime dependencies land there,
# at exactly the locked versions. The runtime stage copies that venv onto the same slim
# base and runs as an unprivileged user; it needs no writable path (a read-only root
# filesystem works; /tmp is a volume for libraries that expect scratch space).
#
# Both stages use the same base (the venv's interpreter is the base's python3.11), pinned
# by digest so a rebuild starts from the same bytes:
#   tag     python:3.11-slim-bookworm (Python 3.11.16, Debian 12)
#   digest  sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b
#           the multi-platform index (linux/amd64 and linux/arm64 among others), so
#           `--platform linux/amd64` and `linux/arm64` each get their own image from it.
# To move to a newer build of the tag, read the index digest with
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# (the "Digest:" line at the top, not a per-platform manifest) and replace it in both
# FROM lines and in the org.opencontainers.image.base.digest label below.

FROM python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ONLY_BINARY=:all: \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src

# Locked, hash-checked wheels for this platform (amd64 or arm64): a layer that changes
# only with the lock.
COPY requirements.lock ./
RUN python -m pip download --require-hashes --no-deps --dest /wheels -r requirements.lock

COPY pyproject.toml README.md LICENSE ./
COPY streamlease ./streamlease
# With the redis and mongodb extras: the image serves every leader backend
# (STREAMLEASE_LEADER_BACKEND) and the mongodb:// sink; the lock's test-only wheels stay in
# this stage's wheelhouse and never reach /opt/venv;
# with the tracing extra it exports spans once an OTEL_EXPORTER_OTLP_*ENDPOINT is set.
RUN python -m pip wheel --no-deps --no-index --find-links /wheels --wheel-dir /dist . \
 && python -m venv --without-pip /opt/venv \
 && wheel=$(echo /dist/streamlease-*.whl) \
 && python -m pip --python /opt/venv/bin/python install --no-index --find-links /wheels \
        "${wheel}[redis,mongodb,tracing]" \
 && /opt/venv/bin/streamlease --help >/dev/null


# python:3.11-slim-bookworm, the same index as the build stage.
FROM python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="streamlease" \
      org.opencontainers.image.description="Self-healing fleet of WebSocket stream workers with DynamoDB leases and fenced writes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/streamlease" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm" \
      org.opencontainers.image.base.digest="sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b"

# tini as PID 1 forwards SIGTERM to the worker and reaps zombies under a plain
# `docker run`; on ECS, initProcessEnabled puts ECS's own init in front of it and tini
# runs beneath as a subreaper (-s). Either alone would be enough.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 streamlease \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin streamlease

COPY --from=build /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    STREAMLEASE_LOG_FORMAT=json \
    STREAMLEASE_METRICS_PORT=9108

WORKDIR /opt/streamlease
VOLUME ["/tmp"]
USER 10001:10001

# /metrics, /healthz (liveness), /readyz.
EXPOSE 9108

# The worker drains on SIGTERM: stops acquiring, flushes, checkpoints and releases every
# lease within STREAMLEASE_SHUTDOWN_SECONDS (25 s): give it more than that before SIGKILL
# (docker stop -t 40; ECS stopTimeout, set by the terraform module).
STOPSIGNAL SIGTERM

# Liveness only: /healthz fails once a held stream went unrenewed for longer than the
# lease. Not readiness: a draining worker must not be restarted.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["streamlease", "healthcheck", "--timeout", "3"]

ENTRYPOINT ["/usr/bin/tini", "-s", "--", "streamlease"]
CMD ["run"]
