"""Run a bench script with another version of ``spark_audit`` in the driver (before/after runs).

    git archive 908bd62 spark_audit | tar -x -C /tmp/audit-old
    .venv/bin/python bench/with_old_spark_audit.py /tmp/audit-old bench/audit_kafka_throughput.py --events 200000 ...

The editable install puts an import finder on ``sys.meta_path`` that wins over ``PYTHONPATH``, so
``PYTHONPATH=/tmp/audit-old`` still imports this worktree's package; this drops that finder and puts
the old tree first on ``sys.path`` (then this repository, for ``ads_broker``, ``dedupe_worker`` and
the bench helpers). Only the driver is affected: Spark's Python workers import the installed package.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, script = sys.argv[1], sys.argv[2]
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
    sys.path[:0] = [old, str(REPO), str(Path(script).resolve().parent)]
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
