"""``python -m tests.fuzz``: the long fuzzing profile (outside CI), and single-frame replays.

    PYTHONPATH=$PWD python -m tests.fuzz --frames 1000000 --seed 1 --all-holes --keep-going

prints every distinct finding with its reproducer (seed and frame index) and exits 1 if any.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.fuzz.frames import FuzzOptions
from tests.fuzz.harness import FuzzRun, FuzzStats


def _progress(began: float) -> Callable[[int, FuzzStats], None]:
    def show(index: int, stats: FuzzStats) -> None:
        elapsed = time.monotonic() - began
        print(f"[{elapsed:6.0f}s] frame #{index}: {stats.summary()} ({stats.frames / max(elapsed, 1e-9):.0f}/s)",
              flush=True)
    return show


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    p.add_argument("--start", type=int, default=0, help="skip to this frame index of the seed's stream")
    p.add_argument("--rss-limit-mib", type=int, default=512, help="bound on the broker's peak RSS (VmHWM)")
    p.add_argument("--rss-warmup-frames", type=int, default=50_000,
                   help="frames of warm-up; after them RSS must plateau (0: no plateau check)")
    p.add_argument("--rss-growth-mib", type=float, default=64.0,
                   help="how far RSS may rise above the warm-up's highest before it is a finding")
    p.add_argument("--check-every", type=int, default=500, help="frames between health/RSS checks")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for each frame's answer")
    p.add_argument("--work-dir", type=Path, default=None, help="broker data and logs (default: a temp dir)")
    p.add_argument("--keep-going", action="store_true", help="record findings and go on (restart after a crash)")
    for hole, flag in ((1, "big-frame-lies"), (2, "bombs"), (3, "many-partitions"), (4, "internal-topics"),
                       (6, "count-lies")):
        p.add_argument(f"--{flag}", action="store_true", help=f"also the family behind issue 12 hole {hole}")
    p.add_argument("--all-holes", action="store_true", help="every family above")
    args = p.parse_args(argv)
    # SIGTERM (and SIGINT, which a background job ignores) unwind through FuzzRun.run, whose
    # ``finally`` stops the broker it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    everything = args.all_holes
    options = FuzzOptions(internal_topics=everything or args.internal_topics,
                          count_lies=everything or args.count_lies, bombs=everything or args.bombs,
                          big_frame_lies=everything or args.big_frame_lies,
                          many_partitions=everything or args.many_partitions)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="ads-fuzz-"))
    print(f"fuzz seed={seed} start={args.start} frames={args.frames} options={options} work_dir={work_dir}",
          flush=True)
    began = time.monotonic()
    run = FuzzRun(seed=seed, frames=args.frames, work_dir=work_dir, options=options, start=args.start,
                  check_every=args.check_every, rss_limit_mib=args.rss_limit_mib,
                  rss_warmup_frames=min(args.rss_warmup_frames, args.frames // 2),
                  rss_growth_limit_mib=args.rss_growth_mib, response_timeout_s=args.timeout,
                  stop_on_first=not args.keep_going, progress=_progress(began),
                  on_finding=lambda f: print(f.report(), flush=True))
    stopped = ""
    try:
        run.run()
    except (KeyboardInterrupt, SystemExit):
        stopped = " (stopped by a signal)"  # the broker is stopped; report what was found so far
    stats = run.stats
    print(f"{stats.summary()} in {time.monotonic() - began:.0f}s{stopped}")
    print(f"mutations: {dict(stats.mutations)}")
    print(f"RSS curve (frame: VmRSS MiB; warm-up high {stats.rss_baseline_mib or 0:.0f} MiB): {stats.rss_curve_text()}")
    for timeout in stats.timeouts:
        print(f"no answer within {args.timeout}s: {timeout}")
    for label, count in sorted(Counter(f.label for f in stats.findings).items()):
        print(f"{count} distinct findings labelled {label}")
    return 1 if stats.findings else 0


if __name__ == "__main__":
    sys.exit(main())
