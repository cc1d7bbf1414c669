"""M4 downsampling: at most max_points out, and every bucket's first, last, minimum and
maximum kept, so no spike can disappear from a chart."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from jobs.metrics.downsample import downsample, downsample_chunks, read_series
from jobs.metrics.rollups import summarize
from jobs.models import JobStatus, MetricPoint, TrainingJob


def buckets_of(steps: np.ndarray, max_points: int) -> list[np.ndarray]:
    """The bucketing, restated plainly: max_points // 4 equal slices of the step range."""
    count = max(1, max_points // 4)
    low, span = int(steps[0]), int(steps[-1]) - int(steps[0]) + 1
    groups: dict[int, list[int]] = {}
    for index, step in enumerate(steps.tolist()):
        groups.setdefault(min(int((step - low) / span * count), count - 1), []).append(index)
    return [np.array(indices) for _, indices in sorted(groups.items())]


def test_a_series_within_the_limit_is_returned_unchanged():
    steps, values = downsample([1, 2, 3], [0.5, 0.25, 0.125], max_points=10)
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [0.5, 0.25, 0.125]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_single_point_spike_survives_a_million_points(sign):
    rng = np.random.default_rng(7)
    steps = np.arange(1_000_000)
    values = rng.normal(0.0, 0.01, size=steps.size)
    values[612_345] = sign * 50.0
    out_steps, out_values = downsample(steps, values, max_points=2000)
    assert len(out_steps) <= 2000
    assert 612_345 in out_steps.tolist() and sign * 50.0 in out_values.tolist()


@pytest.mark.parametrize("max_points", [4, 7, 100, 2000])
def test_every_bucket_keeps_its_first_last_min_and_max(max_points):
    rng = np.random.default_rng(max_points)
    # Irregular steps (gaps, bursts) and values with repeats.
    steps = np.cumsum(rng.integers(1, 50, size=20_000))
    values = np.round(rng.normal(size=steps.size), 2)
    out_steps, out_values = downsample(steps, values, max_points)
    assert len(out_steps) <= max_points
    assert np.all(np.diff(out_steps) > 0), "sorted, no duplicates"
    kept = dict(zip(out_steps.tolist(), out_values.tolist(), strict=True))
    for bucket in buckets_of(steps, max_points):
        bucket_values = values[bucket]
        assert steps[bucket[0]] in kept and steps[bucket[-1]] in kept
        assert bucket_values.min() in {kept[s] for s in steps[bucket].tolist() if s in kept}
        assert bucket_values.max() in {kept[s] for s in steps[bucket].tolist() if s in kept}


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_single_point_spike_survives_a_million_points_drawn_from_chunks(sign):
    rng = np.random.default_rng(8)
    steps = np.arange(1_000_000)
    values = rng.normal(0.0, 0.01, size=steps.size)
    values[612_345] = sign * 50.0
    chunks = summarize(steps, values)
    assert len(chunks) == 1_000_000 // 256 + 1 and int(chunks.count.sum()) == 1_000_000
    out_steps, out_values = downsample_chunks(chunks, max_points=2000)
    assert len(out_steps) <= 2000 and np.all(np.diff(out_steps) > 0)
    assert 612_345 in out_steps.tolist() and sign * 50.0 in out_values.tolist()
    lookup = dict(zip(steps.tolist(), values.tolist(), strict=True))
    assert all(lookup[s] == v for s, v in zip(out_steps.tolist(), out_values.tolist(), strict=True)), "real points"


def test_chunk_summaries_hold_first_last_and_earliest_extremes():
    steps = np.array([3, 0, 1, 2, 255, 256, 300, -1])  # any order; -1 is in chunk -1
    values = np.array([7.0, 1.0, np.nan, 7.0, -2.0, np.nan, np.nan, 4.0])
    chunks = summarize(steps, values)
    assert chunks.chunk.tolist() == [-1, 0, 1] and chunks.count.tolist() == [1, 5, 2]
    assert chunks.first_step.tolist() == [-1, 0, 256] and chunks.last_step.tolist() == [-1, 255, 300]
    assert chunks.min_step[1] == 255 and chunks.min_value[1] == -2.0
    assert chunks.max_step[1] == 2 and chunks.max_value[1] == 7.0, "the earlier of two equal maxima"
    assert np.isnan(chunks.min_value[2]) and np.isnan(chunks.max_value[2]), "all NaN: no extremes"
    out_steps, out_values = downsample_chunks(chunks, 40)
    assert out_steps.tolist() == [-1, 0, 2, 255, 256, 300]
    assert np.isnan(out_values[-1]) and out_values[2] == 7.0


def test_kept_points_are_real_points_of_the_series():
    steps = np.arange(0, 30_000, 3)
    values = np.sin(steps / 100.0)
    out_steps, out_values = downsample(steps, values, 500)
    lookup = dict(zip(steps.tolist(), values.tolist(), strict=True))
    assert all(lookup[s] == v for s, v in zip(out_steps.tolist(), out_values.tolist(), strict=True))


def test_nan_values_do_not_hide_a_bucket_s_extremes():
    values = np.zeros(10_000)
    values[100:200] = np.nan
    values[150] = 9.0  # inside the NaN stretch
    values[5000] = -9.0
    out_steps, out_values = downsample(np.arange(10_000), values, 40)
    assert 150 in out_steps.tolist() and 5000 in out_steps.tolist()


def test_huge_steps_do_not_overflow():
    steps = np.array([0, 2**62, 2**62 + 1, 2**63 - 2], dtype=np.int64)
    out_steps, _ = downsample(steps, [1.0, 5.0, -5.0, 2.0], 4)
    assert out_steps.tolist() == steps.tolist()


def test_read_series_downsamples_from_the_database(project):
    job = TrainingJob.objects.create(project=project, name="big", status=JobStatus.COMPLETED)
    at = datetime(2024, 1, 1, tzinfo=UTC)
    values = [1.0 / (1 + step) for step in range(5000)]
    values[3333] = 42.0
    MetricPoint.objects.bulk_create(
        [MetricPoint(job=job, name="loss", step=step, rank=0, value=value, time=at) for step, value in enumerate(values)]
        + [MetricPoint(job=job, name="loss", step=step, rank=1, value=0.0, time=at) for step in range(10)], batch_size=1000)

    series = read_series(job.pk, "loss", 0, 100)
    assert series.total == 5000 and series.downsampled and len(series.steps) <= 100
    assert [3333, 42.0] in series.points()
    assert series.points()[0] == [0, 1.0] and series.points()[-1][0] == 4999

    window = read_series(job.pk, "loss", 0, 1000, min_step=100, max_step=199)
    assert window.total == 100 and not window.downsampled and window.points()[0][0] == 100
    assert read_series(job.pk, "loss", 1, 100).total == 10
    assert read_series(job.pk, "nothing", 0, 100).total == 0
