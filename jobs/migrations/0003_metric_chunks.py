# MetricPoint.job loses its database foreign key (the flusher checks job ids per batch;
# the ORM still cascades deletes), and MetricChunk holds M4 rollups of every series,
# filled here from the points already stored. The backfill is written out in full rather
# than imported from jobs.metrics.rollups, so that later changes to that module cannot
# change what this migration did; it uses the chunk size of that time (2^8 steps).

import django.db.models.deletion
from django.db import migrations, models

CHUNK_BITS = 8


def summarize(points):
    """[(step, value)] in step order → {chunk: fields}: count, first, last and the
    earliest points holding the minimum and maximum value (NaN ignored)."""
    chunks: dict[int, dict] = {}
    for step, value in points:
        chunk = step >> CHUNK_BITS
        c = chunks.get(chunk)
        if c is None:
            c = chunks[chunk] = {"count": 0, "first_step": step, "first_value": value, "min_step": None,
                                 "min_value": None, "max_step": None, "max_value": None}
        c["count"] += 1
        c["last_step"], c["last_value"] = step, value
        if value != value:
            continue
        if c["min_value"] is None or value < c["min_value"]:
            c["min_step"], c["min_value"] = step, value
        if c["max_value"] is None or value > c["max_value"]:
            c["max_step"], c["max_value"] = step, value
    return chunks


def backfill_python(apps, schema_editor):
    MetricPoint = apps.get_model("jobs", "MetricPoint")
    MetricChunk = apps.get_model("jobs", "MetricChunk")
    db = schema_editor.connection.alias
    series = MetricPoint.objects.using(db).values_list("job_id", "name", "rank").distinct().order_by()
    for job_id, name, rank in list(series):
        points = (MetricPoint.objects.using(db).filter(job_id=job_id, name=name, rank=rank).order_by("step")
                  .values_list("step", "value").iterator(chunk_size=10_000))
        MetricChunk.objects.using(db).bulk_create(
            [MetricChunk(job_id=job_id, name=name, rank=rank, chunk=chunk, **fields)
             for chunk, fields in summarize(points).items()], batch_size=1000)


BACKFILL_POSTGRES = f"""
INSERT INTO jobs_metricchunk (job_id, name, rank, chunk, count, first_step, first_value, last_step, last_value,
                              min_step, min_value, max_step, max_value)
WITH a AS (
    SELECT job_id, name, rank, step >> {CHUNK_BITS} AS chunk, count(*) AS count, min(step) AS first_step,
           max(step) AS last_step, min(value) FILTER (WHERE value <> 'NaN') AS min_value,
           max(value) FILTER (WHERE value <> 'NaN') AS max_value
    FROM jobs_metricpoint GROUP BY job_id, name, rank, step >> {CHUNK_BITS}),
e AS (
    SELECT a.job_id, a.name, a.rank, a.chunk,
           max(p.value) FILTER (WHERE p.step = a.first_step) AS first_value,
           max(p.value) FILTER (WHERE p.step = a.last_step) AS last_value,
           min(p.step) FILTER (WHERE p.value = a.min_value) AS min_step,
           min(p.step) FILTER (WHERE p.value = a.max_value) AS max_step
    FROM jobs_metricpoint p JOIN a
      ON p.job_id = a.job_id AND p.name = a.name AND p.rank = a.rank AND p.step >> {CHUNK_BITS} = a.chunk
    WHERE p.step = a.first_step OR p.step = a.last_step OR p.value = a.min_value OR p.value = a.max_value
    GROUP BY a.job_id, a.name, a.rank, a.chunk)
SELECT a.job_id, a.name, a.rank, a.chunk, a.count, a.first_step, e.first_value, a.last_step, e.last_value,
       e.min_step, a.min_value, e.max_step, a.max_value
FROM a JOIN e USING (job_id, name, rank, chunk)
"""


def backfill(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKFILL_POSTGRES)
    else:
        backfill_python(apps, schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0002_training_job_fields'),
    ]

    operations = [
        migrations.AlterField(
            model_name='metricpoint',
            name='job',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_points', to='jobs.trainingjob'),
        ),
        migrations.CreateModel(
            name='MetricChunk',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('rank', models.IntegerField(default=0)),
                ('chunk', models.BigIntegerField()),
                ('count', models.IntegerField()),
                ('first_step', models.BigIntegerField()),
                ('first_value', models.FloatField()),
                ('last_step', models.BigIntegerField()),
                ('last_value', models.FloatField()),
                ('min_step', models.BigIntegerField(null=True)),
                ('min_value', models.FloatField(null=True)),
                ('max_step', models.BigIntegerField(null=True)),
                ('max_value', models.FloatField(null=True)),
                ('job', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_chunks', to='jobs.trainingjob')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('job', 'name', 'rank', 'chunk'), name='one_chunk_per_series_range')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
