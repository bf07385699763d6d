"""The SparkSession the audit runs in: quiet, small, and with workers on this interpreter."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Spark's JVM logs warnings and errors (its default profile logs INFO and announces itself);
#: Hadoop's "unable to load native-hadoop library" is noise on every laptop and container.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeio.level = error
"""


def jvm_log_path() -> Path:
    """Where the driver JVM's own output goes: ``SPARK_AUDIT_JVM_LOG``, or a file per process in
    the temp directory. Python-side errors are raised as usual; this file holds Spark's side."""
    env = os.environ.get("SPARK_AUDIT_JVM_LOG")
    return Path(env) if env else Path(tempfile.gettempdir()) / f"spark-audit-jvm-{os.getpid()}.log"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the JVM starts: the JVM inherits it for good
    (its start-up warnings and log4j's console go there), this process gets its stderr back."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)


def build_session(master: str = "local[*]", app_name: str = "spark-audit", shuffle_partitions: int = 8,
                  conf: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession and register the ``kafka_confluent`` and ``audit_input_counts`` sources.

    Spark's Python workers import pyarrow and confluent-kafka, so they must run this project's
    interpreter: for a local master ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to
    ``sys.executable`` (a stray system python would fail with "No module named 'pyarrow'"). On a
    cluster the caller's values win (executors run a shipped venv, not the driver's path).

    The driver JVM is quiet on the terminal: it logs warnings and errors (:data:`LOG4J2`) to
    :func:`jvm_log_path`, with its start-up lines; a local master binds to 127.0.0.1
    (``SPARK_LOCAL_IP``) instead of warning that the host name resolves to loopback.
    """
    from pyspark.sql import SparkSession

    from spark_audit.datasource import KafkaDataSource
    from spark_audit.exceptions import AuditError
    from spark_audit.export_datasource import InputCountsDataSource

    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if master.startswith("local"):
            os.environ[name] = sys.executable
        else:
            os.environ.setdefault(name, sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local[N] talks to itself on loopback
    jvm_log = jvm_log_path()
    jvm_log.parent.mkdir(parents=True, exist_ok=True)
    log4j = jvm_log.with_name(jvm_log.stem + "-log4j2.properties")
    log4j.write_text(LOG4J2)
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    options = f"-Dlog4j2.configurationFile=file:{log4j}"
    builder = builder.config("spark.driver.extraJavaOptions", options)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    try:
        with _stderr_to(jvm_log):
            spark = builder.getOrCreate()
    except Exception as e:
        said = jvm_log.read_text(errors="replace")[-3000:] if jvm_log.exists() else "(nothing)"
        raise AuditError(f"Spark did not start: {e}. The JVM's output ({jvm_log}) ends with:\n{said}\n"
                         "Check that Java 17+ is installed (make apt-deps) and JAVA_HOME points at it.") from e
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(InputCountsDataSource)
    return spark
