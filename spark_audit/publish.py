"""Reports to S3: ``spark-audit run --out s3://bucket/prefix/`` (the nightly EMR Serverless run).

The report is written to a local directory first (Spark's and matplotlib's writers want files),
then every file is uploaded with boto3's managed transfer under ``prefix/<run>/``, where ``<run>``
is ``date=YYYY-MM-DD`` for a day's audit (so nightly runs keep each report) or
``window=<start>_<end>``. Credentials and region come from the usual AWS chain (the job's role);
``AWS_ENDPOINT_URL`` points boto3 elsewhere (tests use moto's server).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from spark_audit.exceptions import AuditError

S3_SCHEME = "s3://"


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEME)


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> (``bucket``, ``a/b/``); the prefix is empty or ends with ``/``."""
    rest = uri[len(S3_SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise AuditError(f"--out {uri!r}: no bucket name; use s3://BUCKET/PREFIX/")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


def run_label(start: datetime, end: datetime, date: str | None) -> str:
    """The per-run folder: ``date=YYYY-MM-DD`` or ``window=<start>_<end>`` (UTC, to the second)."""
    if date is not None:
        return f"date={date}"
    fmt = "%Y%m%dT%H%M%SZ"
    return f"window={start.strftime(fmt)}_{end.strftime(fmt)}"


def upload_report(local: Path, uri: str, label: str, *, client: Any = None) -> str:
    """Upload every file under ``local`` to ``uri``/``label``/; returns the report's S3 URI."""
    import boto3
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(uri)
    s3 = client or boto3.client("s3")
    base = f"{prefix}{label}/"
    try:
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            s3.upload_file(str(path), bucket, base + path.relative_to(local).as_posix())
    except (BotoCoreError, ClientError, S3UploadFailedError) as e:
        raise AuditError(f"uploading the report to s3://{bucket}/{base} failed: {e}; the report is kept in "
                         f"{local}") from e
    return f"s3://{bucket}/{base}report.json"
