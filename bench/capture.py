"""The node agent's output capture (jobs.runner.process.capture): what matching a job's
`metric_definitions` with a time limit costs per line, beside Python's unlimited `re` in the
same run.

    .venv/bin/python bench/capture.py [--lines 100000] [--repeats 5]

Two kinds of output: every line carries both metrics ("[rank0]:step=N train_loss=… lr=…",
the worst case), and a chatty script's mix (one such line in ten, the rest progress text).
Each pair feeds the same --lines lines through an
OutputCapture with two definitions (train_loss, lr), its log on local disk and a publisher
that drops what it is given (Redis is not what is measured): once with the definitions
compiled by jobs.patterns (the `regex` module, 50 ms limit, GIL released — what the agent
runs) and once with `re` and no limit (the baseline: what it ran before, which a pattern
like `(a|aa)+$` freezes). Prints µs per line of each and the median ratio. Informational:
it exits 0 (the limit is what keeps one user's regex from freezing a node).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.runner.process.capture import MetricRule, OutputCapture, compile_metric_rules  # noqa: E402

DEFINITIONS = [{"name": "train_loss", "regex": r"train_loss=([0-9.]+)"}, {"name": "lr", "regex": r"lr=([0-9.eE-]+)"}]


class DropPublisher:
    def put_line(self, *args: object) -> None:
        pass

    def put_point(self, *args: object) -> None:
        pass


def feed(lines: list[str], *, limited: bool) -> float:
    rules, _ = compile_metric_rules(DEFINITIONS)
    if not limited:  # the baseline: re's patterns (UserPattern quacks like one)
        rules = [MetricRule(r.name, re.compile(r.pattern.pattern), r.value_group, r.has_step) for r in rules]
    with tempfile.TemporaryDirectory() as logs:
        out = OutputCapture(logs_dir=Path(logs), max_bytes=1 << 30, rules=rules, publisher=DropPublisher())  # type: ignore[arg-type]
        started = time.perf_counter()
        for line in lines:
            out.feed(line, "out", 0.0)
        elapsed = time.perf_counter() - started
        out.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    every = [f"[rank0]:step={i} train_loss=0.{i % 997} lr=0.001 epoch 3 batch {i}" for i in range(args.lines)]
    mixed = [every[i] if i % 10 == 0 else f"[rank0]:epoch 3 batch {i}/5000 [{'=' * (i % 40)}>] 12.3 it/s"
             for i in range(args.lines)]
    for label, lines in (("every line with both metrics", every), ("one line in ten with metrics", mixed)):
        ratios = []
        for pair in range(args.repeats):
            order = (True, False) if pair % 2 else (False, True)  # alternate which goes first
            took = {limited: feed(lines, limited=limited) for limited in order}
            ratios.append(took[True] / took[False])
            print(f"  {label}, pair {pair + 1}: re (no limit) {took[False] / args.lines * 1e6:.2f} µs/line, "
                  f"jobs.patterns (50 ms limit) {took[True] / args.lines * 1e6:.2f} µs/line, ratio {ratios[-1]:.2f}")
        print(f"{label}: median time ratio {median(ratios):.2f}x of re without a limit "
              f"({min(ratios):.2f}-{max(ratios):.2f}, {args.repeats} pairs of {args.lines:,} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
