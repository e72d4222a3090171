# syntax=docker/dockerfile:1
# The neffcache index server (and the maintenance commands: token, prune, pull, reconcile).
#
#   docker build -f deploy/docker/server.Dockerfile -t neffcache-server .      (from the repo root)
#   docker run -p 8787:8787 -e NEFFCACHE_SERVER_DATABASE_URL=postgresql+psycopg://... neffcache-server
#
# Two stages so the image carries no compiler, no pip cache and no source tree: only the venv.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc for the C listing helper (neffcache/stores/_listdir.c: prune and reconcile list local stores);
# the slim image has Python's headers but no compiler, and pip would go on without the helper.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the wheel is built from: a change to tests/, bench/ or deploy/ keeps this layer cached.
COPY pyproject.toml setup.py README.md ./
COPY neffcache/ neffcache/
COPY cli/ cli/
COPY server/ server/
COPY warmers/ warmers/
# A venv at a fixed path is copied whole into the runtime stage (same base image, same Python).
# [server] for the index, [s3] so the same image can run prune/pull/reconcile against S3.
RUN python -m venv /opt/neffcache \
    && /opt/neffcache/bin/pip install --no-cache-dir ".[server,s3]" \
    && /opt/neffcache/bin/neffcache --version | grep -x "native listing: active"

FROM ${PYTHON_IMAGE}
# A fixed, unprivileged uid/gid: Kubernetes' runAsNonRoot can verify a numeric USER, and the
# SQLite data dir (embedded mode only) is owned by it.
RUN groupadd --system --gid 10001 neffcache \
    && useradd --system --uid 10001 --gid neffcache --home-dir /var/lib/neffcache --create-home \
       --shell /usr/sbin/nologin neffcache
COPY --from=build /opt/neffcache /opt/neffcache
ENV PATH=/opt/neffcache/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NEFFCACHE_SERVER_DATA_DIR=/var/lib/neffcache/server
USER 10001:10001
WORKDIR /var/lib/neffcache
EXPOSE 8787
# /healthz never touches the database, so a database outage does not get every container
# restarted; /readyz (database + schema) is for load balancers and Kubernetes readiness.
# The slim image has no curl: Python's urllib does the probe.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["neffcache"]
# 0.0.0.0 inside the container; publish the port explicitly. The schema is migrated before
# uvicorn starts (replicas on one PostgreSQL take turns on an advisory lock).
CMD ["serve", "--host", "0.0.0.0", "--port", "8787"]
