"""Write the audit report: ``report.json`` (the contract), ``index.html`` and its PNG charts.

The HTML is rendered from the same dictionary that is written to ``report.json``, so the numbers
on the page are the JSON's numbers; each headline number carries ``data-metric="<json key>"`` so
a test (or a curious analyst) can check them against each other.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

HEADLINE = (
    "input_messages", "input_unique", "input_duplicates", "input_duplicate_rate",
    "input_first_seen_before_window", "output_messages", "output_duplicates", "missing",
    "dead_lettered", "dead_letters_missing", "timestamp_outliers", "window_catch_rate",
)
CHARTS = {
    "duplicate_rate_by_hour.png": "Input duplicate rate by hour",
    "retry_gap_histogram.png": "Retry gap (first copy to duplicate)",
    "duplicate_rate_by_library.png": "Input duplicate rate by source library",
}


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """Write report.json, the charts and index.html into ``out_dir``; return the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    write_charts(report, out_dir)
    (out_dir / "index.html").write_text(render_html(report))
    return path


def format_number(value: Any) -> str:
    """How a metric appears on the page: integers as is, rates as fractions with 6 decimals."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value)


def write_charts(report: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = report["by_hour"]
    _bar(plt, out_dir / "duplicate_rate_by_hour.png", CHARTS["duplicate_rate_by_hour.png"],
         [h["hour"][11:16] for h in hours], [h["duplicate_rate"] or 0.0 for h in hours], "duplicate rate")
    buckets = report["retry_gap_buckets"]
    _bar(plt, out_dir / "retry_gap_histogram.png", CHARTS["retry_gap_histogram.png"],
         list(buckets), list(buckets.values()), "duplicates")
    libs = report["by_library"]
    _bar(plt, out_dir / "duplicate_rate_by_library.png", CHARTS["duplicate_rate_by_library.png"],
         [str(r["library"]) for r in libs], [r["duplicate_rate"] or 0.0 for r in libs], "duplicate rate")


def _bar(plt: Any, path: Path, title: str, labels: list[str], values: list[float], ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    try:
        if labels:
            ax.bar(range(len(labels)), values, color="#3b6ea5")
            ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data in this window", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def render_html(report: dict[str, Any]) -> str:
    esc = html.escape
    window = report["window"]
    status = report["status"]
    rows = "".join(
        f'<tr><th>{esc(k)}</th><td data-metric="{esc(k)}">{esc(format_number(report[k]))}</td></tr>'
        for k in HEADLINE
    )
    gaps = "".join(
        f'<tr><th>{esc(k)}</th><td data-metric="retry_gap_buckets.{esc(k)}">{v}</td></tr>'
        for k, v in report["retry_gap_buckets"].items()
    )
    reasons = "".join(
        f'<tr><th>{esc(k)}</th><td data-metric="dead_letter_reasons.{esc(k)}">{v}</td></tr>'
        for k, v in report["dead_letter_reasons"].items()
    ) or "<tr><td>none</td></tr>"
    bad = "".join(
        f'<tr><th>{esc(k)}</th><td data-metric="bad_input.{esc(k)}">{v}</td></tr>'
        for k, v in report["bad_input"].items()
    )
    charts = "".join(f'<figure><img src="{name}" alt="{esc(title)}"><figcaption>{esc(title)}</figcaption></figure>'
                     for name, title in CHARTS.items())
    notes = "".join(f"<li>{esc(p)}</li>" for p in report["alerts"] + report["problems"]) or "<li>none</li>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Duplicate audit {esc(window['start'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:1em}}
th,td{{border:1px solid #ccc;padding:4px 8px;text-align:left}}.alert{{color:#b00}}.ok{{color:#070}}</style>
</head><body>
<h1>Duplicate audit</h1>
<p>Window {esc(window['start'])} to {esc(window['end'])} (lookback from {esc(window['lookback_start'])},
dedupe window {window['dedupe_window_seconds']:.0f} s). Status:
<strong class="{esc(status)}" data-metric="status">{esc(status)}</strong></p>
<h2>Alerts and problems</h2><ul>{notes}</ul>
<h2>Totals</h2><table>{rows}</table>
<h2>Retry gaps</h2><table>{gaps}</table>
<h2>Dead-letter reasons</h2><table>{reasons}</table>
<h2>Bad input</h2><table>{bad}</table>
<h2>Charts</h2>{charts}
<h2>Top clients by duplicate rate</h2>{_table(report['top_clients'])}
<h2>By source library</h2>{_table(report['by_library'])}
<h2>By event type</h2>{_table(report['by_event_type'])}
<h2>By day</h2>{_table(report['by_day'])}
<p>Detail tables (Parquet): <code>details/</code>. Machine-readable: <a href="report.json">report.json</a>.</p>
</body></html>
"""


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(format_number(v))}</td>" for v in r.values()) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
