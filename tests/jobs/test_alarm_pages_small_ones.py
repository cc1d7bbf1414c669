"""The Alarms page and the job page's events strip: recent alarms name their job (#id and
name, linked), event times say they are UTC, and ?project= naming no readable project is a 404."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.utils import timezone

from jobs.models import AlarmTransition, JobRule, JobStatus, RuleState
from tests.factories import make_job

AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def _alarm(job, name="hot"):
    rule = JobRule.objects.create(job=job, name=name, type="non_finite", state=RuleState.ALARM, state_reason="NaN",
                                  state_changed_at=AT, actions=[])
    AlarmTransition.objects.create(rule=rule, job=job, from_state="OK", to_state="ALARM", step=8, reason="NaN",
                                   values={}, actions_taken=[], at=AT)
    return rule


def test_recent_alarms_link_the_job_with_its_id_and_name(client, owner, project):
    job = make_job(project, name="<b>diverged</b>", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    _alarm(job)
    client.force_login(owner)
    html = client.get("/alarms/").content.decode()
    recent = html[html.index('id="recent-alarms"'):]
    assert re.search(rf'<a href="/jobs/{job.pk}/">#{job.pk} &lt;b&gt;diverged&lt;/b&gt;</a>', recent), recent[:600]
    assert "2026-03-04 05:06:07 UTC" in recent


def test_the_events_strip_labels_its_times_utc(client, owner, project):
    job = make_job(project, name="run", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    _alarm(job)
    client.force_login(owner)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    strip = html[html.index('id="rule-events"'):]
    assert re.search(r'<time datetime="2026-03-04T05:06:07\+00:00"[^>]*>05:06:07 UTC</time>', strip), strip[:600]


def test_a_project_filter_naming_no_readable_project_is_a_404(client, owner, outsider, project, other_project):
    mine = make_job(project, name="mine", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    _alarm(mine)
    client.force_login(owner)
    for slug in ("nope", other_project.slug):  # unknown, and another team's: the same answer
        response = client.get(f"/alarms/?project={slug}")
        assert response.status_code == 404
        assert 'data-rule="hot"' not in response.content.decode()
    narrowed = client.get(f"/alarms/?project={project.slug}")
    assert narrowed.status_code == 200 and 'data-rule="hot"' in narrowed.content.decode()
    assert client.get("/alarms/?project=").status_code == 200  # empty: all my projects
