"""`trainyard spend` against a live studio: the month's totals by instance type and by user,
its line items, as CSV (what the Spend page downloads) and as JSON; a bad month is the API's
message and exit code 2."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from jobs import cost
from jobs.models import JobAttempt, JobStatus, TrainingJob


def _billed(project, owner, name: str, seconds: int, price: str) -> TrainingJob:
    job = TrainingJob.objects.create(project=project, name=name, script_uri="file:///x.py", entry_point="x.py",
                                     created_by=owner, status=JobStatus.COMPLETED, attempt=1, finished_at=timezone.now(),
                                     resources={"instance_type": "cpu", "instance_count": 1})
    end = timezone.now()
    JobAttempt.objects.create(job=job, attempt=1, started_at=end - timedelta(seconds=seconds), finished_at=end,
                              training_started_at=end - timedelta(seconds=seconds / 2), price_per_hour=Decimal(price),
                              currency="USD", outcome="completed")
    cost.settle_launches(job.pk)
    return job


def test_spend_prints_the_month_its_line_items_and_csv(studio, cli, project, owner):
    _billed(project, owner, "nightly", 3600, "2.5")
    _billed(project, owner, "[bold]tiny[/bold]", 1800, "2.5")  # rich markup in a name is shown, not applied
    month = cost.current_month()

    summary = cli("spend")
    assert summary.returncode == 0, summary.stderr
    assert f"{month}: 3.75 USD over 2 job(s), 2 launch(es)" in summary.stdout, summary.stdout
    assert "cpu" in summary.stdout and "owner" in summary.stdout

    items = cli("spend", "--launches")
    assert items.returncode == 0, items.stderr
    assert "nightly" in items.stdout and "[bold]tiny[/bold]" in items.stdout and "2.50 USD" in items.stdout

    as_csv = cli("spend", "--csv", "--month", month)
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["job_name"] for r in rows] == ["nightly", "[bold]tiny[/bold]"]
    assert sum(Decimal(r["cost"]) for r in rows) == Decimal("3.75")

    as_json = cli("spend", "--json")
    assert json.loads(as_json.stdout)["total"]["cost_display"] == "3.75"

    bad = cli("spend", "--month", "2026-13")
    assert bad.returncode == 2 and "month: Use YYYY-MM with a month 01-12" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
