"""Write the audit report: ``report.json`` (the contract), ``index.html`` and its PNG charts.

The HTML is rendered from the same dictionary that is written to ``report.json``, so the numbers
on the page are the JSON's numbers; each headline number carries ``data-metric="<json key>"`` so
a test (or a curious analyst) can check them against each other.
"""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HEADLINE = (
    "input_messages", "input_unique", "input_duplicates", "input_duplicate_rate",
    "input_first_seen_before_window", "output_messages", "output_duplicates", "missing",
    "dead_lettered", "dead_letters_missing", "timestamp_outliers", "window_catch_rate",
)
#: What each report.json field is called on the page (the JSON keeps its names: schema_version 1).
LABELS = {
    "input_messages": "Input events",
    "input_unique": "Distinct messageIds in the input",
    "input_duplicates": "Duplicates the API received",
    "input_duplicate_rate": "Input duplicate rate",
    "input_first_seen_before_window": "Ids first seen before the window",
    "output_messages": "Output events",
    "output_duplicates": "Duplicates leaked to the output",
    "missing": "Events missing from the output",
    "dead_lettered": "Dead-lettered events",
    "dead_letters_missing": "Malformed events without a dead letter",
    "timestamp_outliers": "Events with an outlier timestamp",
    "window_catch_rate": "Duplicates the dedupe window catches",
    "max_output_duplicates": "leaked duplicates",
    "max_missing": "missing events",
    "max_dead_letters_missing": "malformed events without a dead letter",
}
GAP_LABELS = {
    "le_1m": "\u2264 1 min", "le_1h": "1 min \u2013 1 h", "le_1d": "1 h \u2013 1 day",
    "le_1w": "1 day \u2013 1 week", "le_window": "1 week \u2013 dedupe window",
    "beyond_window": "beyond the dedupe window",
}
BAD_INPUT_LABELS = {
    "unparseable_values": "Values that are not JSON objects",
    "missing_timestamps": "Events without a timestamp",
    "missing_message_ids": "Events without a messageId (dead-lettered by the workers)",
    "bad_timestamps": "Events with an impossible timestamp",
}
REASON_LABELS = {
    "missing_message_id": "No messageId", "invalid_json": "Value is not a JSON object",
    "message_id_too_long": "messageId over 200 bytes", "invalid_utf8_key": "Key is not UTF-8",
    "unknown": "No reason header",
}
COLUMN_LABELS = {
    "day": "Day (UTC)", "hour": "Hour (UTC)", "library": "Source library", "event_type": "Event type",
    "client": "Client (userId or anonymousId)", "input_messages": "Events", "input_duplicates": "Duplicates",
    "duplicate_rate": "Duplicate rate",
}
CHARTS = {
    "duplicate_rate_by_hour.png": "Input duplicate rate by hour",
    "retry_gap_histogram.png": "Retry gap (first copy to duplicate)",
    "duplicate_rate_by_library.png": "Input duplicate rate by source library",
}
#: Which alert each threshold guards, in the order the verdict names them.
VERDICT_CHECKS = (
    ("output_duplicates", "max_output_duplicates", "duplicates leaked"),
    ("missing", "max_missing", "events missing"),
    ("dead_letters_missing", "max_dead_letters_missing", "dead letters missing"),
)


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """Write report.json, the charts and index.html into ``out_dir``; return the JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    write_charts(report, out_dir)
    (out_dir / "index.html").write_text(render_html(report))
    return path


def format_number(value: Any) -> str:
    """How a metric appears on the page: counts with thousands separators, rates (the report's
    only floats) as percentages, ``n/a`` for none."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float):
        return format_percent(value)
    return f"{value:,}"


def format_percent(rate: float) -> str:
    """``0.00592`` -> ``0.59 %``; small non-zero rates keep two significant digits (``0.0012 %``)."""
    pct = rate * 100
    if 0 < abs(pct) < 0.01:
        return f"{pct:.2g} %"
    return f"{pct:.2f} %"


def format_time(iso: str | None) -> str:
    """An ISO-8601 timestamp of the report to the second, in UTC: ``2026-11-20 00:00:00 UTC``."""
    if not iso:
        return "n/a"
    at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def format_duration(seconds: float) -> str:
    """``604800`` -> ``7 days``; ``5400`` -> ``1 h 30 min``; to the second."""
    rest = round(seconds)
    parts = []
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{n} {unit}{'s' if unit == 'day' and n > 1 else ''}")
    return " ".join(parts) or "0 s"


def verdict(report: dict[str, Any]) -> tuple[str, str]:
    """The page's one-line verdict and its CSS class: ``clean``, or what is wrong, with the counts
    against their thresholds; a missing or empty output (no evidence) is named first."""
    found = []
    thresholds = report.get("thresholds", {})
    if report["status"] == "alert" and any(a.startswith("output ") for a in report.get("alerts", [])):
        found.append("output missing or empty")
    for metric, limit, words in VERDICT_CHECKS:
        allowed = thresholds.get(limit, 0)
        if (report.get(metric) or 0) > allowed:
            found.append(f"{words} ({report[metric]:,} > {allowed:,} allowed)")
    if not found:
        return "Clean: no duplicates leaked, no events missing", "ok"
    return "Alert: " + "; ".join(found), "alert"


def _threshold_text(report: dict[str, Any]) -> str:
    return ", ".join(f"{LABELS[k]} \u2264 {v:,}" for k, v in report.get("thresholds", {}).items() if k in LABELS)


def human_alert(text: str) -> str:
    """``output_duplicates 1 > threshold 0`` -> ``Duplicates leaked to the output: 1 (threshold 0)``."""
    match = re.fullmatch(r"(\w+) (\d+) > threshold (\d+)", text)
    if match is None or match.group(1) not in LABELS:
        return text
    return f"{LABELS[match.group(1)]}: {int(match.group(2)):,} (threshold {int(match.group(3)):,})"


def write_charts(report: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = report["by_hour"]
    _bar(plt, out_dir / "duplicate_rate_by_hour.png", CHARTS["duplicate_rate_by_hour.png"],
         [h["hour"][11:16] for h in hours], [(h["duplicate_rate"] or 0.0) * 100 for h in hours],
         "Hour of the day (UTC)", "Input duplicate rate (%)")
    buckets = report["retry_gap_buckets"]
    _bar(plt, out_dir / "retry_gap_histogram.png", CHARTS["retry_gap_histogram.png"],
         [GAP_LABELS.get(k, k) for k in buckets], list(buckets.values()),
         "Time from the first copy to the duplicate", "Duplicates (events)")
    libs = report["by_library"]
    _bar(plt, out_dir / "duplicate_rate_by_library.png", CHARTS["duplicate_rate_by_library.png"],
         [str(r["library"]) for r in libs], [(r["duplicate_rate"] or 0.0) * 100 for r in libs],
         "Source library (context.library.name)", "Input duplicate rate (%)")


def _bar(plt: Any, path: Path, title: str, labels: list[str], values: list[float], xlabel: str,
         ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.8), dpi=100)
    try:
        if labels:
            ax.bar(range(len(labels)), values, color="#3b6ea5")
            ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data in this window", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def _metric_rows(items: list[tuple[str, str, Any]]) -> str:
    """Table rows: label, and the value in a cell carrying ``data-metric`` (its report.json path)."""
    esc = html.escape
    return "".join(f'<tr><th>{esc(label)}</th><td data-metric="{esc(path)}">{esc(format_number(value))}</td></tr>'
                   for label, path, value in items)


def render_html(report: dict[str, Any]) -> str:
    esc = html.escape
    window = report["window"]
    status = report["status"]
    line, css = verdict(report)
    rows = _metric_rows([(LABELS[k], k, report[k]) for k in HEADLINE])
    gaps = _metric_rows([(GAP_LABELS.get(k, k), f"retry_gap_buckets.{k}", v)
                         for k, v in report["retry_gap_buckets"].items()])
    reasons = _metric_rows([(REASON_LABELS.get(k, k.replace("_", " ")), f"dead_letter_reasons.{k}", v)
                            for k, v in report["dead_letter_reasons"].items()]) or "<tr><td>none</td></tr>"
    bad = _metric_rows([(BAD_INPUT_LABELS.get(k, k), f"bad_input.{k}", v) for k, v in report["bad_input"].items()])
    charts = "".join(f'<figure><img src="{name}" alt="{esc(title)}"><figcaption>{esc(title)}</figcaption></figure>'
                     for name, title in CHARTS.items())
    notes = "".join(f"<li>{esc(human_alert(p))}</li>" for p in report["alerts"] + report["problems"]) \
        or "<li>none</li>"
    sources = report.get("sources", {})
    source_rows = "".join(f"<tr><th>{esc(role.replace('_', '-').capitalize())} source</th>"
                          f"<td>{esc(str(where or 'none'))}</td></tr>" for role, where in sources.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Duplicate audit {esc(format_time(window['start']))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse;margin-bottom:1em}}
th,td{{border:1px solid #ccc;padding:4px 8px;text-align:left}}td[data-metric]{{text-align:right}}
.verdict{{font-size:1.3em;font-weight:bold;padding:.5em .8em;border-radius:4px}}
.verdict.alert{{background:#fde8e8;color:#900}}.verdict.ok{{background:#e6f4ea;color:#060}}
.thresholds{{color:#444;margin-top:.3em}}figure{{display:inline-block;margin:0 1em 1em 0}}</style>
</head><body>
<p class="verdict {esc(css)}" id="verdict">{esc(line)}</p>
<p class="thresholds" id="thresholds">Alert thresholds: {esc(_threshold_text(report))}.
Status <code data-metric="status">{esc(status)}</code>.</p>
<h1>Duplicate audit</h1>
<p>Window {esc(format_time(window['start']))} to {esc(format_time(window['end']))}; earlier copies looked
up from {esc(format_time(window['lookback_start']))}; dedupe window
{esc(format_duration(window['dedupe_window_seconds']))}. Generated {esc(format_time(report.get('generated_at')))}.</p>
<table>{source_rows}</table>
<h2>Alerts and problems</h2><ul>{notes}</ul>
<h2>Totals</h2><table>{rows}</table>
<h2>Retry gaps (time from the first copy to each duplicate)</h2><table>{gaps}</table>
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
    head = "".join(f"<th>{html.escape(COLUMN_LABELS.get(k, k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(format_number(v))}</td>" for v in r.values()) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
