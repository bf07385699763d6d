# syntax=docker/dockerfile:1
# Worker and broker image. The Spark audit runs from its own image (pyspark is ~0.5 GB).
# confluent-kafka and rocksdict wheels are manylinux_2_28: the base needs glibc >= 2.28 (bookworm).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY ads_broker ./ads_broker
COPY dedupe_worker ./dedupe_worker
COPY ebs_ops ./ebs_ops
COPY spark_audit ./spark_audit
RUN pip install --no-cache-dir . \
    && useradd --uid 10001 --create-home app \
    && mkdir -p /data && chown 10001 /data

USER 10001
VOLUME ["/data"]
EXPOSE 9092
ENTRYPOINT ["ads-broker"]
CMD ["serve", "--data-dir", "/data", "--listen", "0.0.0.0:9092"]
