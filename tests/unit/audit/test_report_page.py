"""Issue 17 item 7: the HTML report reads without a decoder, and a real headless browser renders it.

Labels instead of field names, rates as percentages, times to the second, a one-line verdict with
the alert thresholds at the top, charts whose axes say what they show; report.json unchanged.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark_audit.job import GAP_BUCKETS, AuditConfig, assemble
from spark_audit.report import render_html, verdict, write_report
from spark_audit.sources import KafkaSource
from tests.unit.audit import scenario as sc


def _report(tmp_path: Path, leaked: int = 1, missing: int = 2) -> dict[str, Any]:
    cfg = AuditConfig(input=KafkaSource("b:9092", "events"), output=KafkaSource("b:9092", "events.deduped"),
                      dlq=KafkaSource("b:9092", "events.dlq"), start=sc.START, end=sc.END, out_dir=tmp_path)
    gaps = dict(zip(GAP_BUCKETS, (6, 2, 1, 1, 1, 1), strict=True))
    totals = {"input_messages": 1_690, "input_duplicates": 12, "input_unique": 1_681,
              "input_first_seen_before_window": 3, "unparseable_values": 1, "missing_timestamps": 0,
              "missing_message_ids": 1, "bad_timestamps": 0, **{f"gap_{k}": v for k, v in gaps.items()}}
    tables = {
        "by_day": [{"day": "2026-11-20", "input_messages": 1_689, "input_duplicates": 12, "duplicate_rate": 0.0071}],
        "by_hour": [{"hour": f"2026-11-20T{h:02d}:00Z", "input_messages": 70, "input_duplicates": h % 3,
                     "duplicate_rate": (h % 3) / 70} for h in range(24)],
        "by_library": [{"library": "analytics.js", "input_messages": 900, "input_duplicates": 8,
                        "duplicate_rate": 8 / 900},
                       {"library": "analytics-ios", "input_messages": 789, "input_duplicates": 4,
                        "duplicate_rate": 4 / 789}],
        "by_event_type": [{"event_type": "track", "input_messages": 1_689, "input_duplicates": 12,
                           "duplicate_rate": 12 / 1_689}],
        "top_clients": [{"client": "user-0", "input_messages": 23, "input_duplicates": 3, "duplicate_rate": 3 / 23}],
    }
    checks = {"dead_letters_missing": 0, "timestamp_outliers": 0, "output_missing": False}
    return assemble(cfg, totals, 1_680, leaked, missing, 2, {"invalid_json": 1, "missing_message_id": 1}, tables,
                    [], checks)


def _visible_text(page: str) -> str:
    body = re.sub(r"<head>.*?</head>|<[^>]+>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", body))


def test_the_page_speaks_to_people_and_report_json_is_unchanged(tmp_path: Path) -> None:
    report = _report(tmp_path)
    write_report(report, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text()) == report  # the contract, field for field
    text = _visible_text((tmp_path / "index.html").read_text())
    assert text.strip().startswith("Alert: duplicates leaked (1 > 0 allowed); events missing (2 > 0 allowed)")
    assert "Alert thresholds: leaked duplicates \u2264 0, missing events \u2264 0, malformed events without a " \
           "dead letter \u2264 0." in text
    assert "Input duplicate rate 0.71 %" in text  # 12 / 1,690, not 0.007101
    assert "Duplicates the dedupe window catches 91.67 %" in text
    assert "Input events 1,690" in text
    assert "Window 2026-11-20 00:00:00 UTC to 2026-11-21 00:00:00 UTC" in text
    assert "dedupe window 7 days" in text
    assert re.search(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\.", text)  # no microseconds
    assert "\u2264 1 min 6" in text and "beyond the dedupe window 1" in text
    assert "Duplicates leaked to the output: 1 (threshold 0)" in text
    for field in ("input_duplicate_rate", "le_1m", "beyond_window", "output_duplicates", "missing_message_id"):
        assert field not in text, field
    assert not re.search(r"\d\.\d{6}", text)  # no raw fractions
    assert not re.search(r":\d\d\.\d+", text)  # no sub-second times


def test_verdict_names_what_is_wrong_or_says_clean(tmp_path: Path) -> None:
    assert verdict(_report(tmp_path, leaked=0, missing=0)) == ("Clean: no duplicates leaked, no events missing", "ok")
    assert verdict(_report(tmp_path, leaked=0, missing=3)) == ("Alert: events missing (3 > 0 allowed)", "alert")
    page = render_html(_report(tmp_path, leaked=0, missing=0))
    assert '<p class="verdict ok" id="verdict">Clean: no duplicates leaked, no events missing</p>' in page


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("ADS_OPS_REQUIRE_TOOLS") == "1":
            pytest.fail("chromium is not installed: `make apt-test-deps` installs Debian's chromium")
        pytest.skip("chromium is not installed (Debian package `chromium`)")
    return found


def _headless(chromium: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # --no-sandbox: the tests run as root in CI; the page is our own file.
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", f"--user-data-dir={home}", "--window-size=1280,2400", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "HOME": str(home)})


def test_headless_chromium_renders_the_page_with_its_verdict(tmp_path: Path) -> None:
    chromium = _chromium()
    out = tmp_path / "report"
    write_report(_report(tmp_path), out)
    url = (out / "index.html").resolve().as_uri()
    dom = _headless(chromium, tmp_path / "home-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    verdict_line = re.search(r'<p class="verdict alert" id="verdict">([^<]*)</p>', dom.stdout)
    assert verdict_line is not None, dom.stdout[:2000]
    assert verdict_line.group(1) == "Alert: duplicates leaked (1 &gt; 0 allowed); events missing (2 &gt; 0 allowed)"
    # The charts load: the browser's DOM keeps the images and their captions.
    assert dom.stdout.count("<figure>") == 3
    shot = tmp_path / "page.png"
    run = _headless(chromium, tmp_path / "home-shot", f"--screenshot={shot}", url)
    assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page, not an empty canvas
