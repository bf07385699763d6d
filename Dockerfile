# syntax=docker/dockerfile:1
# Two images from one file (docs/DEPLOYMENT.md):
#   docker build --target worker -t ads-dedupe/worker .   dedupe-worker, ads-broker, ebs-ops
#   docker build --target audit  -t ads-dedupe/audit  .   the above plus Java 17, pyspark, pyarrow
# confluent-kafka and rocksdict wheels are manylinux_2_28: the base needs glibc >= 2.28 (bookworm).
# hadolint checks this file in `make test` (tests/ops/test_dockerfile.py); no Docker engine runs there.

# --- build: a virtualenv with the project and its wheels, copied whole into the runtime stages ---
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# gcc and the libc headers compile the C record walk (ads_broker/log/_walk.c; the image has Python's
# headers); only the venv is copied into the runtime stages, which stay compiler-free. Not pinned,
# like openjdk below: Debian drops a security-updated version from the archive.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY ads_broker ./ads_broker
COPY dedupe_worker ./dedupe_worker
COPY ebs_ops ./ebs_ops
COPY spark_audit ./spark_audit
RUN /opt/venv/bin/pip install --no-cache-dir .

FROM build AS build-audit
RUN /opt/venv/bin/pip install --no-cache-dir '.[spark]'

# --- runtime base: no compiler, no pip cache, tini as PID 1, a numeric non-root user ---
FROM python:3.11-slim-bookworm AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DEDUPE_DATA_DIR=/data \
    DEDUPE_METRICS_PORT=9400
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 app \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin app \
    && mkdir -p /data /reports \
    && chown 10001:10001 /data /reports
COPY ops/docker/preflight.py ops/docker/healthcheck.py /usr/local/lib/ads-dedupe/
WORKDIR /data
# A worker on one instance: each partition's EBS volume is mounted at /data/partition-<p>.
VOLUME ["/data"]

# --- worker: dedupe-worker by default; `ads-broker serve ...` or `ebs-ops ...` as the command ---
FROM runtime AS worker
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
# 9400: worker /metrics. 9092: ads-broker when run in this image (loopback unless configured).
EXPOSE 9400 9092
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/usr/local/lib/ads-dedupe/healthcheck.py"]
# preflight refuses to start a worker whose partition volume is missing or another partition's,
# then execs the command; tini reaps children and forwards SIGTERM for a graceful stop.
ENTRYPOINT ["tini", "--", "python", "/usr/local/lib/ads-dedupe/preflight.py"]
# The broker, when this image runs it, binds loopback: an operator who wants it reachable passes
# `--listen` with an authenticated listener (SASL_SSL) of their own.
CMD ["dedupe-worker", "run"]

# --- audit: the nightly Spark job (local mode in the container, or EMR Serverless) ---
FROM runtime AS audit
# openjdk is not pinned: Debian replaces its version with every security update and drops the old
# one from the archive, so a pin would break the build within weeks (.hadolint.yaml says the same).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-audit /opt/venv /opt/venv
ENV SPARK_LOCAL_IP=127.0.0.1
USER 10001:10001
# A batch job: nothing to probe while it runs; the exit code is its health.
HEALTHCHECK NONE
ENTRYPOINT ["tini", "--"]
CMD ["spark-audit", "--help"]
