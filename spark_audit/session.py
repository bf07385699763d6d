"""The SparkSession the audit runs in: quiet, small, and with workers on this interpreter."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
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


#: Files of this process's JVM to remove at exit (see :func:`_remove_at_exit`).
_LEFTOVERS: list[Path] = []


def _remove_leftovers() -> None:
    for path in _LEFTOVERS:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    _LEFTOVERS.clear()


def _remove_at_exit(*paths: Path) -> None:
    """Remove ``paths`` when this interpreter exits (the JVM writes its log until then: a session
    that is stopped keeps its gateway JVM for the next one in the same process)."""
    if not _LEFTOVERS:
        atexit.register(_remove_leftovers)
    _LEFTOVERS.extend(p for p in paths if p not in _LEFTOVERS)


def _launch_jvm(settings: dict[str, str], jvm_log: Path) -> None:
    """Start the driver JVM (pyspark's gateway) with its stdout and stderr on ``jvm_log``, unless
    this process already has one (a second session reuses it; ``PYSPARK_GATEWAY_PORT`` names one
    started by someone else). This process's own stderr is never touched, so the progress lines
    logged while the JVM starts reach the terminal (pointing fd 2 at the log while the JVM started
    sent them to the JVM log)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False)
    conf.setAll(list(settings.items()))
    with open(jvm_log, "ab") as out:  # the child keeps its own copy of the descriptor
        gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def build_session(master: str = "local[*]", app_name: str = "spark-audit", shuffle_partitions: int = 8,
                  conf: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession and register the ``kafka_confluent`` and ``audit_input_counts`` sources.

    Spark's Python workers import pyarrow and confluent-kafka, so they must run this project's
    interpreter: for a local master ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set to
    ``sys.executable`` (a stray system python would fail with "No module named 'pyarrow'"). On a
    cluster the caller's values win (executors run a shipped venv, not the driver's path).

    The driver JVM is quiet on the terminal: its stdout and stderr are :func:`jvm_log_path` (warnings
    and errors, :data:`LOG4J2`, and its start-up lines), this process's are untouched; the log and
    the log4j file are removed when this process exits (a log named by ``SPARK_AUDIT_JVM_LOG`` is
    kept, and so is the log of a JVM that did not start: the error quotes and names it). A local
    master binds to 127.0.0.1 (``SPARK_LOCAL_IP``) instead of warning that the host name resolves
    to loopback.
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
    settings = {
        "spark.master": master, "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        **(conf or {}),
    }
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        _launch_jvm(settings, jvm_log)
        spark = builder.getOrCreate()
    except Exception as e:
        # The log stays (the error names it); the properties file is ours only.
        _remove_at_exit(log4j)
        said = jvm_log.read_text(errors="replace")[-3000:] if jvm_log.exists() else "(nothing)"
        raise AuditError(f"Spark did not start: {e}. The JVM's output ({jvm_log}) ends with:\n{said}\n"
                         "Check that Java 17+ is installed (make apt-deps) and JAVA_HOME points at it.") from e
    # A log the user named (SPARK_AUDIT_JVM_LOG) is theirs to keep; the default one goes at exit.
    _remove_at_exit(log4j, *(() if os.environ.get("SPARK_AUDIT_JVM_LOG") else (jvm_log,)))
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(InputCountsDataSource)
    return spark
