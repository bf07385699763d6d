"""One audit in a fresh process, as the test suite runs them: SparkSession start, the audit of the
unit tests' scenario day (Parquet), then a second audit in the same (now warm) JVM. Prints one JSON
line with the seconds of each step and the JIT options the JVM got (``JDK_JAVA_OPTIONS``).

Compare JIT settings by interleaving runs (docs/TESTING.md)::

    python bench/audit_cold_start.py /tmp/a1
    JDK_JAVA_OPTIONS=-XX:TieredStopAtLevel=1 python bench/audit_cold_start.py /tmp/b1
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_audit.api import run_config
from spark_audit.session import build_session
from tests.unit.audit import scenario as sc
from tests.unit.audit.test_audit_exports import config


def main(root: Path) -> None:
    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    data = sc.build()
    placed = sc.write_parquet([*data["input"], sc.untimed()], root / "in", "events")
    sc.write_parquet(data["output"], root / "out", "events.deduped")
    sc.write_parquet(sc.linked(data["dlq"], placed), root / "dlq", "events.dlq")
    t1 = time.monotonic()
    spark = build_session("local[2]", shuffle_partitions=4)
    t2 = time.monotonic()
    first = run_config(config(root), spark=spark).report
    t3 = time.monotonic()
    second = run_config(config(root, out_dir=root / "report-2"), spark=spark).report
    t4 = time.monotonic()
    spark.stop()
    print(json.dumps({"jdk_java_options": os.environ.get("JDK_JAVA_OPTIONS", ""), "session_s": round(t2 - t1, 1),
                      "first_audit_s": round(t3 - t2, 1), "second_audit_s": round(t4 - t3, 1),
                      "total_s": round(t4 - t0, 1), "same_report": first["missing"] == second["missing"]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("audit-cold-start"))
