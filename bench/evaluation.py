"""Evaluation throughput against the bare predictor loop, and calibration, in one run.

    .venv/bin/python bench/evaluation.py [--rows 20000] [--images 1500] [--repeats 5] [--threads N]

1. A private SQLite studio (temporary data dir, embedded Redis unless REDIS_URL is set:
   submit_evaluation enqueues on commit; nothing consumes the queue, evaluate() is called here).
2. Two demo models trained in-process by the built-in algorithms (the code the runner
   launches): tabular-classifier on the demo table's full train.csv (its default
   hyperparameters), image-classifier on demo-shapes (its default hyperparameters); each
   tarred into the object store, registered from a Completed job.
3. Held-out data the models never saw, registered and validated as dataset versions:
   `--rows` tabular rows (datasets.demo.tabular_records, another seed, no label noise) and
   `--images` shapes drawn with another seed.
4. Per model and repeat, interleaved (the order alternates each repeat): the evaluation,
   evaluations.run.evaluate(evaluation) — stage, read, predict in chunks keeping the logits,
   report with 1,000 bootstrap resamples, temperature (and isotonic) fit, proposal, scores
   artifact — and the bare loop: the same staging and reading, then
   predictor.predict(parse_instances(chunk)) in the same chunks, nothing else.
   records/s of each, and evaluation / bare per repeat (median and range); target ≥ 0.8.
5. Where the difference goes: the evaluation's metric steps timed alone on its stored scores
   (the report, of it the 1,000-resample bootstrap, and the calibration fits).
6. Each model's ECE (15 bins, equal width and equal mass) and NLL on the evaluation's test part
   before and after temperature scaling, and the temperature.
After one warm-up of each (imports, predictor load, the staging cache). About a minute on 2
CPUs. Exits 0 whether or not the target is met (it says which); 1 only on an error.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_RATIO = 0.8
HELD_OUT_SEED = 7
IMAGE_SEED = 9
TABULAR_HYPERPARAMETERS = {"label_column": "label", "log_every_steps": 100, "seed": 3}
IMAGE_HYPERPARAMETERS = {"log_every_steps": 100, "seed": 3}


@dataclass
class Case:
    name: str
    evaluation: Any
    records: int = 0
    evaluation_seconds: list[float] = field(default_factory=list)
    bare_seconds: list[float] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)


def setup_studio(data_dir: Path) -> tuple[Any, Any]:
    os.environ["STUDIO_DATA_DIR"] = str(data_dir)
    os.environ["STUDIO_MODEL_CACHE_DIR"] = str(data_dir / "model-cache")
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from studio import actions
    from studio.models import Role

    call_command("migrate", interactive=False, verbosity=0)
    project = actions.create_project(slug="bench", name="Bench")
    user = actions.ensure_user("bench", password="bench-password-1")
    actions.set_membership(project=project, user=user, role=Role.SCIENTIST)
    return project, user


def train(project: Any, user: Any, root: Path, module: str, algorithm: str, hyperparameters: dict,
          channels: dict[str, dict[str, Path]], model_name: str) -> Any:
    """Train in this process, store model/ as the runner does, register it; the model version."""
    from datasets.storage import object_uri
    from hosting.actions import register_model
    from jobs.models import JobStatus, TrainingJob
    from jobs.runner.artifacts import upload_archive
    from tests.algorithms.test_algorithms import JobDir, assert_ok, run_in_process

    job_dir = JobDir(root / model_name, hyperparameters)
    for channel, files in channels.items():
        for relative, source in files.items():
            target = job_dir.channel(channel) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    started = time.monotonic()
    assert_ok(run_in_process(job_dir, module))
    config = json.loads((job_dir.model / "config.json").read_text())
    print(f"trained {algorithm} in {time.monotonic() - started:.1f} s: {config.get('metrics')}")
    uri = object_uri(f"bench/{model_name}/model.tar.gz")
    upload_archive(job_dir.model, uri)
    job = TrainingJob.objects.create(project=project, name=model_name, algorithm=algorithm, status=JobStatus.COMPLETED,
                                     model_uri=uri, final_metrics=config.get("metrics") or {},
                                     hyperparameters=hyperparameters, created_by=user)
    return register_model(project=project, name=model_name, job=job, user=user)


def register(project: Any, user: Any, name: str, files: dict[str, Path], fmt: str, label_column: str = "") -> Any:
    from datasets.actions import VersionOptions, register_local_files
    from datasets.validation_run import run_validation

    options = VersionOptions(format=fmt, label_column=label_column) if label_column else VersionOptions(format=fmt)
    version, _ = register_local_files(project=project, name=name, description="", user=user, files=files, options=options)
    status = run_validation(version.pk)
    if status != "ready":
        version.refresh_from_db()
        raise SystemExit(f"{name} did not validate: {status} {getattr(version, 'failure_reason', '')}")
    version.refresh_from_db()
    return version


def prepare(data_dir: Path, rows: int, images: int) -> list[Case]:
    """The two models, their held-out versions and a Pending evaluation of each."""
    project, user = setup_studio(data_dir)
    from datasets import demo
    from evaluations.actions import submit_evaluation
    from evaluations.models import Evaluation

    work = data_dir / "work"
    (work / "tabular").mkdir(parents=True)
    tables = demo.write_tabular(work / "tabular")
    tabular = train(project, user, work, "algorithms.tabular", "tabular-classifier", TABULAR_HYPERPARAMETERS,
                    {"train": {"train.csv": tables["train.csv"]}, "validation": {"validation.csv": tables["validation.csv"]}},
                    "biomes")
    shapes = demo.write_shapes(work / "shapes")
    image = train(project, user, work, "algorithms.image", "image-classifier", IMAGE_HYPERPARAMETERS,
                  {channel: {rel.split("/", 1)[1]: path for rel, path in shapes.items() if rel.startswith(f"{channel}/")}
                   for channel in ("train", "validation")}, "shapes")

    held_csv = work / "held.csv"
    records = demo.tabular_records(rows, HELD_OUT_SEED, label_noise=0.0)
    with open(held_csv, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    held_images: dict[str, Path] = {}
    rng = random.Random(IMAGE_SEED)
    for index in range(images):
        shape = demo.SHAPES[index % len(demo.SHAPES)]
        relative = f"{shape}/{index:05d}.png"
        path = work / "held-shapes" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        demo.draw_shape(shape, rng).save(path, format="PNG")
        held_images[relative] = path
    tabular_data = register(project, user, "held-out-table", {"held.csv": held_csv}, "csv", label_column="label")
    image_data = register(project, user, "held-out-shapes", held_images, "image_folder")

    cases = []
    for name, model, data in (("tabular", tabular, tabular_data), ("image", image, image_data)):
        evaluation = submit_evaluation(project=project, user=user, body={
            "model_version": model.pk, "dataset_version": data.pk, "target_error": 0.05})
        evaluation = Evaluation.objects.select_related("model_version__model", "dataset_version__dataset",
                                                       "project").get(pk=evaluation.pk)
        cases.append(Case(name, evaluation))
    return cases


def bare_loop(evaluation: Any) -> int:
    """The same staging, reading and chunks as the evaluation, then predict() only; the records predicted."""
    from evaluations.records import labelled_records, stage
    from evaluations.run import CHUNK
    from hosting.serving import parse_instances, predictor_for

    version, dataset_version = evaluation.model_version, evaluation.dataset_version
    with tempfile.TemporaryDirectory(prefix="bench-bare-") as tmp:
        stage(dataset_version, evaluation.channel, Path(tmp))
        data = labelled_records(version, dataset_version, Path(tmp))
    instances = [instance for instance, label in zip(data.instances, data.labels, strict=True) if label]
    predictor = predictor_for(version)
    for start in range(0, len(instances), CHUNK):
        parsed, _contents = parse_instances(version, instances[start:start + CHUNK])
        predictor.predict(parsed)
    return len(instances)


def evaluate_once(case: Case) -> None:
    from evaluations.run import evaluate

    begun = time.perf_counter()
    case.fields = evaluate(case.evaluation)
    case.evaluation_seconds.append(time.perf_counter() - begun)


def bare_once(case: Case) -> None:
    begun = time.perf_counter()
    case.records = bare_loop(case.evaluation)
    case.bare_seconds.append(time.perf_counter() - begun)


def measure(cases: list[Case], repeats: int) -> None:
    for case in cases:  # warm-up: imports, the predictor's load, the staging cache
        evaluate_once(case)
        bare_once(case)
        case.evaluation_seconds.clear()
        case.bare_seconds.clear()
    for repeat in range(repeats):
        for case in cases:
            steps = (bare_once, evaluate_once) if repeat % 2 == 0 else (evaluate_once, bare_once)
            for step in steps:
                step(case)


def metric_seconds(case: Case, repeats: int) -> dict[str, float]:
    """Medians of the evaluation's own metric steps alone, on its stored scores: the share of the
    evaluation that is not reading and predicting."""
    from evaluations.run import CURVE_CLASSES, bootstrap_resamples, fit_calibration, read_scores
    from trainyard import evaluation as metrics

    case.evaluation.artifacts = case.fields["artifacts"]
    scores = read_scores(case.evaluation)
    labels = [str(label) for label in case.evaluation.labels]
    probabilities = metrics.softmax(scores.logits)
    resamples = bootstrap_resamples(len(scores.targets))  # as the evaluation drew them
    steps = {
        "bootstrap": lambda: metrics.bootstrap_replicates(probabilities, scores.targets, bins=15, resamples=resamples),
        "report": lambda: metrics.classification_report(probabilities, scores.targets, labels, bins=15,
                                                        bootstrap=resamples, curve_classes=CURVE_CLASSES),
        "calibration": lambda: fit_calibration(scores.logits, scores.targets, labels, scores.calibration_part,
                                               scores.test_part),
    }
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(max(repeats, 1)):
        for name, step in steps.items():
            begun = time.perf_counter()
            step()
            timings[name].append(time.perf_counter() - begun)
    return {name: statistics.median(values) for name, values in timings.items()}


def report(cases: list[Case], repeats: int) -> bool:
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{os.cpu_count()} CPUs, load average {load:.1f}, torch threads {torch.get_num_threads()}; "
          f"{repeats} interleaved repeats, medians\n")
    print(f"{'model':<8} {'records':>8} {'bare rec/s':>11} {'eval rec/s':>11} {'eval / bare':>12} {'range':>13}")
    met = True
    for case in cases:
        ratios = [bare / evaluated for bare, evaluated in zip(case.bare_seconds, case.evaluation_seconds, strict=True)]
        ratio = statistics.median(ratios)
        met = met and ratio >= TARGET_RATIO
        bare_rate = case.records / statistics.median(case.bare_seconds)
        eval_rate = case.records / statistics.median(case.evaluation_seconds)
        print(f"{case.name:<8} {case.records:>8,} {bare_rate:>11,.0f} {eval_rate:>11,.0f} {ratio:>11.2f}× "
              f"{min(ratios):>6.2f}–{max(ratios):.2f}")
    print(f"\ntarget evaluation / bare ≥ {TARGET_RATIO}: {'met' if met else 'NOT met'}")
    print(f"\n{'model':<8} {'evaluation ms':>14} {'bare ms':>8} {'report ms':>10} {'of it bootstrap':>16} "
          f"{'calibration ms':>15}   (metric steps alone, on the evaluation's scores)")
    for case in cases:
        steps = metric_seconds(case, repeats)
        print(f"{case.name:<8} {statistics.median(case.evaluation_seconds) * 1000:>14.0f} "
              f"{statistics.median(case.bare_seconds) * 1000:>8.0f} {steps['report'] * 1000:>10.0f} "
              f"{steps['bootstrap'] * 1000:>16.0f} {steps['calibration'] * 1000:>15.0f}")
    for case in cases:
        calibration = case.fields["calibration"]
        report_fields = case.fields["report"]
        before, after = calibration["before"], calibration["after"]
        print(f"\n{case.name}: accuracy {report_fields.get('accuracy', float('nan')):.4f} on all {case.records:,}; "
              f"temperature {calibration['temperature']:.3f} fitted on {calibration['calibration_items']:,}, "
              f"test part {calibration['test_items']:,}")
        print(f"  {'ECE (15 bins)':<16} {'before':>8} {'after':>8}")
        print(f"  {'equal width':<16} {before['ece_width']:>8.4f} {after['ece_width']:>8.4f}")
        print(f"  {'equal mass':<16} {before['ece_mass']:>8.4f} {after['ece_mass']:>8.4f}")
        print(f"  {'NLL':<16} {before['nll']:>8.4f} {after['nll']:>8.4f}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="held-out tabular rows (default 20,000)")
    parser.add_argument("--images", type=int, default=1_500, help="held-out images (default 1,500)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per model (default 5)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads while measuring (default: torch's own, as a control worker runs)")
    args = parser.parse_args()
    begun = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-evaluation-"))
    redis = None
    try:
        if not os.environ.get("REDIS_URL"):
            from studio.embedded_redis import EmbeddedRedis

            redis = EmbeddedRedis(data_dir / "redis")
            os.environ["REDIS_URL"] = redis.start()
        cases = prepare(data_dir, args.rows, args.images)
        print(f"prepared in {time.monotonic() - begun:.0f} s")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        measure(cases, args.repeats)
        report(cases, args.repeats)  # a missed target is printed, not an exit status: `make bench` goes on
    finally:
        if redis is not None:
            redis.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"\ntotal {time.monotonic() - begun:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
