#!/usr/bin/env python
"""DDP throughput on 1 vs 2 processes of this machine: samples/s and scaling
efficiency, each beside the one-process baseline from the same run.

    python bench/ddp_scaling.py [--steps 60] [--repeat 2]

char-lm (the built-in transformer) on the demo text, launched exactly as a job's node
launches it — `python -m torch.distributed.run --standalone --nproc_per_node P` — over a
hand-made SageMaker job directory (no studio around it, so only training is measured).
Each process takes `batch_size` windows per step, so samples/s = steps/s × batch × P.
Two comparisons:
  * per core: every process single-threaded (OMP_NUM_THREADS=1), 1 vs 2 processes —
    what adding a worker adds;
  * whole machine: 1 process with all cores vs 2 processes with one each — what DDP
    gives over letting torch's own threads use the machine.
Efficiency = samples/s(P) / (P × samples/s(1)). On a GPU machine run the same with
`--gpus`: one process per GPU (NCCL), 1 vs all GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STEPS_LINE = re.compile(r"trained steps (\d+)\.\.(\d+) in ([0-9.]+)s \(([0-9.]+) steps/s\)")


def job_dir(base: Path, text: dict[str, Path]) -> dict[str, str]:
    for sub in ("model", "output/data", "checkpoints", "input/config", "input/data/train"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for name, path in text.items():
        if name.startswith("train"):
            (base / "input/data/train" / path.name).symlink_to(path)
    return {"SM_MODEL_DIR": str(base / "model"), "SM_OUTPUT_DIR": str(base / "output"),
            "SM_OUTPUT_DATA_DIR": str(base / "output/data"), "SM_CHECKPOINT_DIR": str(base / "checkpoints"),
            "SM_CHANNELS": json.dumps(["train"]), "SM_CHANNEL_TRAIN": str(base / "input/data/train"),
            "SM_HOSTS": json.dumps(["bench"]), "SM_CURRENT_HOST": "bench"}


def run(processes: int, threads: int | None, hps: dict, text: dict[str, Path], work: Path, gpus: bool) -> float:
    base = work / f"p{processes}-t{threads}-{len(list(work.iterdir()))}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "TRAINYARD_"))}
    env.update(job_dir(base, text))
    env.update({"SM_HPS": json.dumps(hps), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                "TRAINYARD_DIST_BACKEND": "nccl" if gpus else "gloo"})
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), "-m", "algorithms.charlm"], cwd=base, env=env, capture_output=True,
                          text=True, timeout=900)
    found = STEPS_LINE.findall(done.stdout + done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{processes} process(es) failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    steps_per_second = float(found[-1][3])
    return steps_per_second * hps["batch_size"] * processes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--gpus", action="store_true", help="one process per GPU, NCCL")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    import django

    django.setup()
    from datasets.demo import write_text

    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-ddp-"))
    (work / "data").mkdir()
    text = write_text(work / "data")
    runs = work / "runs"
    runs.mkdir()
    hps = {"epochs": 100, "max_steps": args.steps, "batch_size": 32, "context_length": 64, "embedding_dim": 128,
           "layers": 3, "heads": 4, "log_every_steps": 20}
    cores = os.cpu_count() or 1
    if args.gpus:
        import torch

        count = torch.cuda.device_count()
        plans = [("GPUs, one process each (NCCL)", [(1, None), (count, None)])]
    else:
        plans = [("per core (1 thread per process)", [(1, 1), (2, 1)]),
                 (f"whole machine ({cores} cores)", [(1, cores), (2, max(1, cores // 2))])]
    print(f"char-lm, batch {hps['batch_size']} per process, {args.steps} steps, best of {args.repeat}")
    for title, plan in plans:
        results: dict[tuple[int, int | None], float] = {}
        for _ in range(args.repeat):  # interleaved: load drift hits both alike
            for processes, threads in plan:
                rate = run(processes, threads, hps, text, runs, args.gpus)
                results[(processes, threads)] = max(rate, results.get((processes, threads), 0.0))
        (p1, t1), (pn, tn) = plan
        one, many = results[(p1, t1)], results[(pn, tn)]
        efficiency = many / (pn * one)
        print(f"{title}:")
        print(f"  {p1} process{'' if p1 == 1 else 'es'} × {t1 or 'default'} thread(s): {one:8.0f} samples/s (baseline)")
        print(f"  {pn} processes × {tn or 'default'} thread(s): {many:8.0f} samples/s   speed-up {many / one:.2f}x, "
              f"scaling efficiency {efficiency:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
