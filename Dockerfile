# syntax=docker/dockerfile:1
# fabric-dra: `docker build -t fabric-dra:dev .`
# The builder makes wheels of the project and of every dependency; the final image installs
# only those wheels (no compilers, no build tools, no source tree) and runs as a fixed non-root
# user, so Kubernetes' runAsNonRoot and runAsUser: 65532 hold without a numeric-user guess.
# The simulators (sim/, fabric-dra-sim) are not in this image: sim/Dockerfile builds theirs.

FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from: metadata first, so the dependency layer is cached while
# only the code changes.
COPY pyproject.toml setup.py README.md LICENSE ./
COPY app ./app
COPY migrations ./migrations
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="fabric-dra" \
      org.opencontainers.image.description="Kubernetes DRA controller for network-attached fabric devices" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The wheels are bind-mounted from the builder, never copied, so no layer keeps them.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels fabric-dra \
 && groupadd --system --gid 65532 fabric-dra \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/fabric-dra \
      --no-create-home --shell /usr/sbin/nologin fabric-dra \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/fabric-dra
# The default database URL (sqlite+aiosqlite:///fabric-dra.db) is relative to the working
# directory: the SQLite file lands here. Mount a volume on it to keep it.
WORKDIR /var/lib/fabric-dra
USER 65532:65532
EXPOSE 8080
# slim has no curl: ask /healthz with Python. The port follows FABRIC_DRA_ADMIN__PORT when the
# environment sets it (a port set only in the config file is not seen here).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('FABRIC_DRA_ADMIN__PORT', '8080'), timeout=4)"]
ENTRYPOINT ["fabric-dra"]
CMD ["run"]
