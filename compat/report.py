"""Render a `make compat` results.json as the Markdown per-test table of docs/COMPATIBILITY.md.

    python compat/report.py .compat-cache/runs/<time>/results.json > table.md

Prints the header line (date, commit, librdkafka, TEST_KAFKA_VERSION, wall time, counts) and one
table row per test in suite order; excluded tests are left out (compat/exclusions lists them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def render(doc: dict) -> str:
    rows = doc["results"]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    out = [
        f"Measured {doc['date']} on commit `{doc['commit']}`, librdkafka from "
        f"`{doc['librdkafka']}` (npm), TEST_KAFKA_VERSION={doc['kafka_version']}, "
        f"{doc['seconds'] / 60:.0f} min wall time: "
        + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) + ".",
        "",
        "| test | variants run | result | time | first failure / skip reason (see Failures) |",
        "|---|---|---|---:|---|",
    ]
    for r in rows:
        if r["status"] == "EXCLUDED":
            continue
        ran = ", ".join(n for n, st in r["variants"].items() if st != "SKIPPED") or "-"
        note = "" if r["status"] == "PASS" else r["reason"]
        note = note.replace("|", "\\|")
        out.append(f"| {r['key']} | {ran} | {r['status']} | {r['seconds']:.1f}s | {note} |")
    return "\n".join(out) + "\n"


def main() -> int:
    doc = json.loads(Path(sys.argv[1]).read_text())
    sys.stdout.write(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
