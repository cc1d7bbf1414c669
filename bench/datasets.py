"""Throughput and memory of dataset validation against a plain csv.reader pass.

    python bench/datasets.py [--size-mb 1024] [--path /tmp/bench.csv]

Generates (once per path and size) a CSV with ints, floats, a boolean, a string category
and a label, times a bare csv.reader pass over it, then times validate_files in a child
process so its peak RSS is its own and not this process's.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, sys.path[0] is bench/, where this very file would shadow the
# `datasets` app; the repository root must come first.
REPO_ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO_ROOT)

RSS_LIMIT_MB = 300
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quebec", "Tbilisi", "Hanoi", "Perth", "Accra"]
LABELS = ["churn", "stay", "upgrade"]


def generate(path: Path, size_mb: int) -> None:
    """Write rows until the file reaches size_mb; a sidecar remembers the size asked for."""
    marker = path.with_name(path.name + ".size")
    if path.exists() and marker.exists() and marker.read_text() == str(size_mb):
        return
    target = size_mb * 1024 * 1024
    rng = random.Random(7)
    written = 0
    row_id = 0
    with path.open("w", encoding="utf-8", newline="") as out:
        out.write("id,age,income,score,ratio,city,active,label\n")
        while written < target:
            lines = []
            for _ in range(10_000):
                row_id += 1
                lines.append(
                    f"{row_id},{rng.randint(18, 90)},{rng.random() * 200000:.2f},{rng.gauss(0, 1):.6f},"
                    f"{rng.random():.4f},{rng.choice(CITIES)},{rng.choice(('true', 'false'))},"
                    f"{rng.choice(LABELS)}\n"
                )
            block = "".join(lines)
            out.write(block)
            written += len(block)
    marker.write_text(str(size_mb))


def baseline(path: Path) -> tuple[float, int]:
    started = time.perf_counter()
    with path.open(encoding="utf-8", newline="") as handle:
        rows = sum(1 for _ in csv.reader(handle)) - 1
    return time.perf_counter() - started, rows


def child_validate(path: Path) -> None:
    from datasets.validation import DataFile, validate_files

    started = time.perf_counter()
    report = validate_files(
        [DataFile(path=path.name, uri=str(path), size=path.stat().st_size)],
        format="csv",
        open_read=lambda uri: open(uri, "rb"),  # noqa: SIM115 - validate_files closes it
    )
    seconds = time.perf_counter() - started
    # Linux reports ru_maxrss in KiB.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "records": report.num_records, "ok": report.ok,
                      "errors": report.errors[:3], "peak_rss_mb": peak_mb}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--path", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    path = args.path or Path(f"/tmp/trainyard-bench-{args.size_mb}mb.csv")
    if args.child:
        child_validate(path)
        return 0

    generate(path, args.size_mb)
    size_mb = path.stat().st_size / 2**20
    base_seconds, base_rows = baseline(path)
    result = subprocess.run([sys.executable, __file__, "--child", "--path", str(path)],
                            check=True, capture_output=True, text=True, cwd=REPO_ROOT)
    child = json.loads(result.stdout.strip().splitlines()[-1])
    if not child["ok"] or child["records"] != base_rows:
        print(f"validation disagrees with the baseline: {child}", file=sys.stderr)
        return 1

    verdict = "PASS" if child["peak_rss_mb"] < RSS_LIMIT_MB else "FAIL"
    print(f"{path}  {size_mb:.0f} MB  {base_rows:,} rows")
    print(f"{'pass':<16}{'seconds':>9}{'MB/s':>9}")
    print(f"{'csv.reader':<16}{base_seconds:>9.1f}{size_mb / base_seconds:>9.1f}")
    print(f"{'validate_files':<16}{child['seconds']:>9.1f}{size_mb / child['seconds']:>9.1f}")
    print(f"ratio validation/baseline: {base_seconds / child['seconds']:.2f} of the throughput "
          f"({child['seconds'] / base_seconds:.2f}x the time)")
    print(f"peak RSS of validation: {child['peak_rss_mb']:.0f} MB  {verdict} (< {RSS_LIMIT_MB} MB)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
