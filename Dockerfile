# syntax=docker/dockerfile:1
# Tiffany engine + API image.
#
#   docker build -t tiffany .
#   docker run --rm -v tiffany-data:/data tiffany
#
# Two stages: the first builds a virtualenv with the package (and the PostgreSQL
# driver), the second copies only that venv onto a clean slim image.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Metadata first, so the dependency layer is reused while only code changes.
COPY pyproject.toml README.md ./
COPY tiffany ./tiffany
# DL3013 (pin versions in pip) does not apply: this installs the source tree
# itself; its dependencies' ranges live in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install '.[postgres]'

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIFFANY_DATA_DIR=/data \
    TIFFANY_HOST=0.0.0.0 \
    TIFFANY_PORT=8000 \
    TIFFANY_LOG_FORMAT=json
# A fixed non-root uid/gid, so volume ownership (and Kubernetes fsGroup) is
# predictable.
RUN groupadd --system --gid 10001 tiffany \
    && useradd --system --uid 10001 --gid tiffany --home-dir /home/tiffany \
       --create-home --shell /usr/sbin/nologin tiffany \
    && mkdir -p /data \
    && chown tiffany:tiffany /data
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# Migrations travel with the image for `tiffany db upgrade` / `alembic upgrade head`.
COPY alembic.ini ./
COPY migrations ./migrations
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
# /data holds the WAL: it must outlive the container.
VOLUME ["/data"]
EXPOSE 8000
# `tiffany serve`: the engine process and the API side-process on port 8000.
# SIGTERM stops the API, then the engine flushes the WAL; unfinished runs
# resume at the next start.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('TIFFANY_PORT', '8000')}/healthz\", timeout=2)"]
STOPSIGNAL SIGTERM
CMD ["tiffany", "serve"]
