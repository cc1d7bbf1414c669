"""M4 rollups (MetricChunk): the flusher keeps them equal to a from-scratch summary of the
raw points whatever arrives (gaps, spikes, NaN, replaced and re-sent points, batches out
of order), and read_series draws long series from them without losing a spike.

Chunks are made tiny here (CHUNK_BITS patched) so that small series span many of them.
The reference implementations below are deliberately plain Python, independent of the
numpy and SQL code under test. Real database (PostgreSQL when DATABASE_URL is set)."""

from __future__ import annotations

import importlib
import json
import math
import random
import threading
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection, transaction

from jobs.metrics import downsample, rollups
from jobs.metrics.downsample import read_series
from jobs.metrics.ingest import Flusher
from jobs.metrics.store import MetricEntry, write_points
from jobs.models import JobStatus, MetricChunk, MetricPoint, TrainingJob
from studio import actions

CHUNK_FIELDS = ("chunk", "count", "first_step", "first_value", "last_step", "last_value", "min_step", "min_value",
                "max_step", "max_value")
BASE_TIME = 1_700_000_000.0


@pytest.fixture
def small_chunks(monkeypatch):
    """8 steps per chunk, and every series read from its chunks."""
    monkeypatch.setattr(rollups, "CHUNK_BITS", 3)
    monkeypatch.setattr(downsample, "RAW_THRESHOLD", 0)


@pytest.fixture
def job(project) -> TrainingJob:
    return TrainingJob.objects.create(project=project, name="rollups", status=JobStatus.TRAINING)


def write(job_id: int, *entries: tuple[int, list[list]]) -> None:
    """One flusher batch: (rank, points) entries, written in one transaction."""
    with transaction.atomic():
        write_points([MetricEntry(job_id=job_id, rank=rank, payload=json.dumps(points).encode())
                      for rank, points in entries])


def same(a: object, b: object) -> bool:
    """Equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


# --- plain references ---------------------------------------------------------------------
def reference_chunks(job_id: int, name: str, rank: int) -> list[tuple]:
    """Per chunk of the stored points: count, first, last, the earliest minimum and
    maximum with NaN ignored (None when all NaN)."""
    size = 2 ** rollups.CHUNK_BITS
    chunks: dict[int, dict] = {}
    for step, value in MetricPoint.objects.filter(job_id=job_id, name=name, rank=rank).order_by("step").values_list(
            "step", "value"):
        chunk = chunks.setdefault(step // size, {"count": 0, "first": (step, value), "min": (None, None),
                                                 "max": (None, None)})
        chunk["count"] += 1
        chunk["last"] = (step, value)
        if math.isnan(value):
            continue
        if chunk["min"][1] is None or value < chunk["min"][1]:
            chunk["min"] = (step, value)
        if chunk["max"][1] is None or value > chunk["max"][1]:
            chunk["max"] = (step, value)
    return [(number, c["count"], *c["first"], *c["last"], *c["min"], *c["max"]) for number, c in sorted(chunks.items())]


def stored_chunks(job_id: int, name: str, rank: int) -> list[tuple]:
    return list(MetricChunk.objects.filter(job_id=job_id, name=name, rank=rank).order_by("chunk")
                .values_list(*CHUNK_FIELDS))


def assert_chunks_match(job_id: int) -> None:
    """Every series' stored chunks equal a from-scratch summary of its raw points."""
    series = set(MetricPoint.objects.filter(job_id=job_id).values_list("name", "rank").distinct())
    series |= set(MetricChunk.objects.filter(job_id=job_id).values_list("name", "rank").distinct())
    for name, rank in sorted(series):
        expected, got = reference_chunks(job_id, name, rank), stored_chunks(job_id, name, rank)
        assert len(expected) == len(got), (name, rank, expected, got)
        for want, have in zip(expected, got, strict=True):
            assert all(same(w, h) for w, h in zip(want, have, strict=True)), (name, rank, want, have)


def reference_m4(chunks: list[tuple], max_points: int) -> list[tuple[int, float]]:
    """M4 at chunk granularity: chunks grouped into max_points // 4 buckets by the
    position of their first step; per bucket the first, last, minimum and maximum point."""
    count = max(1, max_points // 4)
    low, high = chunks[0][2], chunks[-1][4]
    groups: dict[int, list[tuple]] = {}
    for index, chunk in enumerate(chunks):
        bucket = min(int((float(chunk[2]) - float(low)) / (float(high) - float(low) + 1.0) * count), count - 1) \
            if len(chunks) > count else index
        groups.setdefault(bucket, []).append(chunk)
    kept: dict[int, float] = {}
    for group in groups.values():
        kept[group[0][2]] = group[0][3]
        kept[group[-1][4]] = group[-1][5]
        lows = [(c[7], c[6]) for c in group if c[7] is not None]
        highs = [(c[9], c[8]) for c in group if c[9] is not None]
        if lows:
            value, step = min(lows, key=lambda p: p[0])  # min() keeps the first on ties: the earliest chunk
            kept[step] = value
        if highs:
            value, step = max(highs, key=lambda p: p[0])
            kept[step] = value
    return sorted(kept.items())


# --- the flusher keeps chunks exact -------------------------------------------------------
def random_batches(rng: random.Random) -> list[list[tuple[int, list[list]]]]:
    """Batches of (rank, points) entries: runs of steps with gaps, in any order, spikes,
    NaN and infinities, ties, and re-sent points (identical, or with another value), some
    twice in one batch. Some batches carry a malformed point (PostgreSQL's validating
    path). Steps include negatives and values near ±2^62 (exactness of the SQL halves)."""
    offsets = {"loss": 0, "acc": -300, "huge": 2**62 + 12_345, "neg": -(2**62) - 77}
    sent: list[tuple[str, int, int, float, float]] = []  # (name, rank, step, value, time)
    batches = []
    for _ in range(rng.randint(12, 20)):
        entries = []
        for _ in range(rng.randint(1, 3)):
            rank = rng.choice([0, 1])
            points: list[list] = []
            if sent and rng.random() < 0.35:  # re-send earlier points
                for name, old_rank, step, value, at in rng.sample(sent, min(len(sent), rng.randint(1, 30))):
                    if old_rank == rank:
                        identical = rng.random() < 0.5
                        points.append([name, step, value if identical else round(rng.gauss(0, 5), 1),
                                       at if identical else at + 1.0])
            name = rng.choice(list(offsets))
            start = offsets[name] + rng.randint(0, 200)
            steps = list(range(start, start + rng.randint(1, 60), rng.choice([1, 1, 2, 5])))
            if rng.random() < 0.3:
                rng.shuffle(steps)
            for step in steps:
                roll = rng.random()
                value = (float("nan") if roll < 0.05 else rng.choice([1e6, -1e6]) if roll < 0.08
                         else float("inf") if roll < 0.09 else round(rng.gauss(0, 3), 1))
                points.append([name, step, value, BASE_TIME + rng.randint(0, 1000)])
            if points and rng.random() < 0.15:
                points.append(list(rng.choice(points)))  # the same point twice in one entry
            if rng.random() < 0.1:
                points.append(["loss", "not a step", 1.0, BASE_TIME])
            rng.shuffle(points)
            entries.append((rank, points))
            sent += [(p[0], rank, p[1], p[2], p[3]) for p in points if isinstance(p[1], int)]
        batches.append(entries)
    rng.shuffle(batches)  # batches out of order
    return batches


@pytest.mark.parametrize("seed", range(8))
def test_rollups_equal_a_from_scratch_summary_of_the_raw_points(small_chunks, job, seed):
    rng = random.Random(seed)
    for number, batch in enumerate(random_batches(rng)):
        write(job.pk, *batch)
        if number % 4 == 0:
            assert_chunks_match(job.pk)
    assert_chunks_match(job.pk)
    total = MetricPoint.objects.filter(job=job).count()
    assert sum(MetricChunk.objects.filter(job=job).values_list("count", flat=True)) == total


def test_a_replaced_extreme_is_recomputed_from_the_raw_points(small_chunks, job):
    write(job.pk, (0, [["loss", step, value, BASE_TIME] for step, value in enumerate([5.0, 4.0, 3.0, -100.0, 2.0, 1.0,
                                                                                      0.0, 6.0])]))
    assert stored_chunks(job.pk, "loss", 0) == [(0, 8, 0, 5.0, 7, 6.0, 3, -100.0, 7, 6.0)]
    # The minimum goes (a resumed run re-logs step 3 with another value), the maximum moves.
    write(job.pk, (0, [["loss", 3, 10.0, BASE_TIME + 1]]))
    assert stored_chunks(job.pk, "loss", 0) == [(0, 8, 0, 5.0, 7, 6.0, 6, 0.0, 3, 10.0)]
    # New points merge into the recomputed chunk; ties keep the earlier step.
    write(job.pk, (0, [["loss", 9, 0.0, BASE_TIME], ["loss", 5, 1.0, BASE_TIME]]))  # 5: an identical redelivery
    assert stored_chunks(job.pk, "loss", 0) == [(0, 8, 0, 5.0, 7, 6.0, 6, 0.0, 3, 10.0),
                                                (1, 1, 9, 0.0, 9, 0.0, 9, 0.0, 9, 0.0)]
    assert_chunks_match(job.pk)


def test_count_stays_exact_when_the_flusher_gets_batches_again(small_chunks, job):
    from tests.jobs.test_metrics_ingest import clear_streams, drain, send

    clear_streams(job.pk)
    try:
        batch = [["loss", step, math.sin(step), BASE_TIME + step] for step in range(300)]
        flusher = Flusher(discover_running=False)
        send(job.pk, batch)
        drain(flusher)
        send(job.pk, batch)  # redelivered twice: nothing changes
        send(job.pk, batch)
        drain(flusher)
        assert sum(c[1] for c in stored_chunks(job.pk, "loss", 0)) == 300
        send(job.pk, [["loss", step, -math.sin(step), BASE_TIME] for step in range(0, 300, 7)])  # changed values
        drain(flusher)
        assert sum(c[1] for c in stored_chunks(job.pk, "loss", 0)) == 300
        assert_chunks_match(job.pk)
    finally:
        clear_streams(job.pk)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite cannot store NaN: NaN points are skipped")
def test_a_chunk_of_nan_has_no_extremes_and_reads_as_nulls(small_chunks, job):
    nan = float("nan")
    write(job.pk, (0, [["loss", step, nan, BASE_TIME] for step in range(8)] + [["loss", 8, 1.0, BASE_TIME]]))
    first = stored_chunks(job.pk, "loss", 0)[0]
    assert first[1] == 8 and math.isnan(first[3]) and first[6:] == (None, None, None, None)
    series = read_series(job.pk, "loss", 0, 100)
    assert series.points() == [[0, None], [7, None], [8, 1.0]]


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite has one writer at a time")
def test_a_recompute_waits_for_a_concurrent_merge_into_the_same_chunk(small_chunks, transactional_db, project):
    """Writer A merges new points 6 and 7 into chunk 0 and has not committed; writer B
    replaces point 3 of the same chunk (so recomputes it from the raw points). B must see
    A's points: it waits for A's lock on the chunk before it reads them."""
    job = TrainingJob.objects.create(project=project, name="race", status=JobStatus.TRAINING)
    write(job.pk, (0, [["loss", step, float(step), BASE_TIME] for step in range(6)]))
    a_merged, a_may_commit, b_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def in_thread(body) -> threading.Thread:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def writer_a() -> None:
        with transaction.atomic():
            write_points([MetricEntry(job_id=job.pk, rank=0, payload=json.dumps(
                [["loss", 6, 6.0, BASE_TIME], ["loss", 7, -7.0, BASE_TIME]]).encode())])
            a_merged.set()
            assert a_may_commit.wait(30)

    def writer_b() -> None:
        # The malformed point sends B straight to the point-by-point path: the fast path
        # could otherwise wait for A on the chunk before failing, and hide the race.
        write(job.pk, (0, [["loss", 3, 30.0, BASE_TIME], ["loss", "bad", 0.0, BASE_TIME]]))
        b_done.set()

    a = in_thread(writer_a)
    assert a_merged.wait(30)
    b = in_thread(writer_b)
    assert not b_done.wait(1.0), "B waits for A's lock on the chunk"
    a_may_commit.set()
    a.join(30)
    b.join(30)
    assert not errors, errors
    assert stored_chunks(job.pk, "loss", 0) == [(0, 8, 0, 0.0, 7, -7.0, 7, -7.0, 3, 30.0)]
    assert_chunks_match(job.pk)


# --- reading from the chunks --------------------------------------------------------------
def test_read_series_from_chunks_is_m4_at_chunk_granularity(small_chunks, job):
    rng = random.Random(3)
    values = [rng.gauss(0, 1) for _ in range(3000)]
    spikes = {rng.randrange(3000): rng.choice([-50.0, 50.0]) for _ in range(12)}
    for step, value in spikes.items():
        values[step] = value
    for start in range(0, 3000, 1000):
        write(job.pk, (0, [["loss", step, values[step], BASE_TIME] for step in range(start, start + 1000)]))

    for max_points in (4, 40, 100, 1000, 2000):
        series = read_series(job.pk, "loss", 0, max_points)
        points = list(zip(series.steps.tolist(), series.values.tolist(), strict=True))
        assert points == reference_m4(reference_chunks(job.pk, "loss", 0), max_points), max_points
        assert len(points) <= max_points and series.total == 3000 and series.downsampled
    kept = dict(points)
    assert all(kept.get(step) == value for step, value in spikes.items()), "every spike is kept"


def test_a_single_step_spike_survives_many_chunks(monkeypatch, job):
    # 20,000 points in 5,000 chunks of 4 steps: the shape of 1M points in 256-step chunks.
    monkeypatch.setattr(rollups, "CHUNK_BITS", 2)
    monkeypatch.setattr(downsample, "RAW_THRESHOLD", 1000)
    rng = random.Random(11)
    spike = rng.randrange(20_000)
    for start in range(0, 20_000, 5000):
        write(job.pk, (0, [["loss", step, 1e9 if step == spike else rng.gauss(0, 0.01), BASE_TIME]
                           for step in range(start, start + 5000)]))
    series = read_series(job.pk, "loss", 0, 400)
    assert series.total == 20_000 and series.downsampled and len(series.steps) <= 400
    assert [spike, 1e9] in series.points()


def test_a_step_range_reads_its_edge_chunks_raw(small_chunks, job):
    values = {step: float(step % 13) for step in range(0, 5000)}
    values[1001], values[1005], values[3997], values[3999] = -99.0, 99.0, -77.0, 77.0  # 1001, 3999: outside
    write(job.pk, (0, [["loss", step, value, BASE_TIME] for step, value in values.items()]))

    series = read_series(job.pk, "loss", 0, 200, min_step=1003, max_step=3998)
    assert series.total == 2996 and series.downsampled and len(series.steps) <= 200
    points = series.points()
    assert points[0][0] == 1003 and points[-1][0] == 3998
    assert [1005, 99.0] in points and [3997, -77.0] in points
    assert all(1003 <= step <= 3998 for step, _ in points)
    assert read_series(job.pk, "loss", 0, 200, min_step=5000).total == 0


def test_a_short_series_is_read_raw_and_exact(monkeypatch, job):
    monkeypatch.setattr(rollups, "CHUNK_BITS", 3)  # RAW_THRESHOLD as shipped: 50,000
    write(job.pk, (0, [["loss", step, float(step), BASE_TIME] for step in range(300)]))
    series = read_series(job.pk, "loss", 0, 1000)
    assert series.total == 300 and not series.downsampled and len(series.steps) == 300


# --- deletes ------------------------------------------------------------------------------
def test_deleting_a_job_or_its_project_deletes_its_points_and_chunks(small_chunks, project):
    jobs = [TrainingJob.objects.create(project=project, name=f"j{i}", status=JobStatus.TRAINING) for i in range(2)]
    other = actions.create_project(slug="other", name="Other")
    kept = TrainingJob.objects.create(project=other, name="kept", status=JobStatus.TRAINING)
    for each in (*jobs, kept):
        write(each.pk, (0, [["loss", step, 1.0, BASE_TIME] for step in range(40)]))

    jobs[0].delete()  # no foreign key in the database: the ORM's cascade does it
    assert not MetricPoint.objects.filter(job_id=jobs[0].pk).exists()
    assert not MetricChunk.objects.filter(job_id=jobs[0].pk).exists()
    project.delete()
    assert not MetricPoint.objects.filter(job_id=jobs[1].pk).exists()
    assert not MetricChunk.objects.filter(job_id=jobs[1].pk).exists()
    assert MetricPoint.objects.filter(job=kept).count() == 40 and MetricChunk.objects.filter(job=kept).count() == 5


def test_points_that_outlive_their_job_are_deleted_when_the_job_is_retired(small_chunks, job):
    # A batch that committed after the job's delete removed its points: nothing in the
    # database refuses it any more; retiring the job cleans up.
    from tests.jobs.test_metrics_ingest import clear_streams

    job_id = job.pk
    clear_streams(job_id)  # ids repeat across test databases; Redis outlives them
    TrainingJob.objects.filter(pk=job_id).delete()
    write(job_id, (0, [["loss", step, 1.0, BASE_TIME] for step in range(20)]))
    assert MetricPoint.objects.filter(job_id=job_id).count() == 20
    Flusher(discover_running=False).retire_finished([job_id])
    assert not MetricPoint.objects.filter(job_id=job_id).exists()
    assert not MetricChunk.objects.filter(job_id=job_id).exists()


# --- the migration ------------------------------------------------------------------------
def test_the_migration_builds_chunks_for_points_already_stored(job):
    migration = importlib.import_module("jobs.migrations.0003_metric_chunks")
    assert rollups.CHUNK_BITS == migration.CHUNK_BITS, "a new chunk size needs a migration that rebuilds them"
    at = datetime(2024, 1, 1, tzinfo=UTC)
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name=name, rank=rank, step=step, value=math.cos(step) * (rank + 1),
                                                 time=at)
                                     for name in ("loss", "acc") for rank in (0, 1) for step in range(-100, 2000, 3)])
    MetricPoint.objects.filter(job=job, name="loss", rank=0, step=500).update(value=1e9)
    editor = SimpleNamespace(connection=connection, execute=lambda sql: connection.cursor().execute(sql))
    migration.backfill(apps, editor)
    assert_chunks_match(job.pk)
    assert MetricChunk.objects.filter(job=job).count() == 4 * len({step >> 8 for step in range(-100, 2000, 3)})
