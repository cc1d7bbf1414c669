"""The rules on the job page, the events strip and the Alarms page (Django's test client)."""

from __future__ import annotations

import re

from django.utils import timezone

from jobs.models import AlarmTransition, JobRule, JobStatus, RuleState
from tests.factories import make_job


def _firing(job, name="hot", reason="loss was NaN at step 8 <script>alert(1)</script>"):
    rule = JobRule.objects.create(job=job, name=name, type="non_finite", state=RuleState.ALARM, state_reason=reason,
                                  state_changed_at=timezone.now(), actions=[{"type": "stop"}])
    AlarmTransition.objects.create(rule=rule, job=job, from_state="OK", to_state="ALARM", step=8, reason=reason,
                                   values={"metric": "loss", "value": "NaN", "step": 8},
                                   actions_taken=[{"type": "stop", "result": "requested"}])
    return rule


def test_the_job_page_shows_its_rules_the_strip_and_why_it_stopped(client, owner, project):
    job = make_job(project, name="diverged", submitted=True, status=JobStatus.STOPPED, stop_reason="RuleTriggered",
                   stop_rule="hot", finished_at=timezone.now())
    _firing(job)
    JobRule.objects.create(job=job, name="quiet", type="stalled", state=RuleState.INSUFFICIENT_DATA,
                           state_reason="waiting for data")
    client.force_login(owner)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="rules-panel"' in html and 'data-rule="hot"' in html and 'data-rule="quiet"' in html
    assert 'id="stop-rule">hot<' in html and "RuleTriggered" in html
    assert 'id="rule-events"' in html and "at step 8" in html and "stop requested" in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'id="rule-marks"' in html  # the charts' marks


def test_the_rules_header_says_watching_while_the_job_runs_and_watched_once_it_ended(client, owner, project):
    running = make_job(project, name="on", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    ended = make_job(project, name="off", submitted=True, status=JobStatus.COMPLETED, finished_at=timezone.now())
    for job in (running, ended):
        JobRule.objects.create(job=job, name="quiet", type="stalled", state=RuleState.OK)
    client.force_login(owner)
    assert "1 rule watching the metric stream" in client.get(f"/jobs/{running.pk}/").content.decode()
    html = client.get(f"/jobs/{ended.pk}/").content.decode()
    assert "1 rule watched the metric stream until the job ended" in html and "watching the metric stream" not in html


def test_the_alarms_page_lists_what_is_firing_in_readable_projects_only(client, owner, outsider, project, other_project):
    mine = make_job(project, name="mine", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    theirs = make_job(other_project, name="theirs", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    _firing(mine)
    _firing(theirs, name="secret-rule")
    JobRule.objects.create(job=mine, name="calm", type="stalled", state=RuleState.OK)
    client.force_login(owner)
    html = client.get("/alarms/").content.decode()
    assert 'data-rule="hot"' in html and "mine" in html
    assert "secret-rule" not in html and "theirs" not in html and 'data-rule="calm"' not in html
    assert "&lt;script&gt;" in html and "<script>alert(1)" not in html
    ok = client.get("/alarms/?state=OK").content.decode()
    assert 'data-rule="calm"' in ok and 'data-rule="hot"' not in ok
    bad = client.get("/alarms/?state=<bad>")  # a 400 that says so, listing the defaults below it, escaped
    assert bad.status_code == 400 and "Unknown state &#x27;&lt;bad&gt;&#x27;" in bad.content.decode()
    assert 'data-rule="hot"' in bad.content.decode() and "Shown below: the rules in ALARM." in bad.content.decode()
    client.force_login(outsider)
    assert 'data-rule="secret-rule"' in client.get("/alarms/").content.decode()


def test_the_alarms_page_says_when_nothing_fires(client, owner):
    client.force_login(owner)
    html = client.get("/alarms/").content.decode()
    assert 'id="alarms-empty"' in html and "Nothing is firing" in html


def test_a_scientist_adds_switches_and_deletes_a_rule_on_the_job_page(client, teammate, viewer, project):
    job = make_job(project, name="running", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    client.force_login(viewer)
    assert 'id="rule-add"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    assert client.post(f"/jobs/{job.pk}/rules/add/", {"type": "stalled"}).status_code == 403
    assert not JobRule.objects.filter(job=job).exists()
    client.force_login(teammate)
    assert 'id="rule-add"' in client.get(f"/jobs/{job.pk}/").content.decode()
    response = client.post(f"/jobs/{job.pk}/rules/add/", {"type": "stalled", "parameters": '{"threshold_seconds": 600}',
                                                          "actions": ["stop", "bogus"]}, follow=True)
    rule = JobRule.objects.get(job=job, name="stalled")
    assert rule.parameters["threshold_seconds"] == 600 and rule.actions == [{"type": "stop"}]
    assert "Rule stalled added" in response.content.decode()
    bad = client.post(f"/jobs/{job.pk}/rules/add/", {"type": "custom", "parameters": '{"metric": "loss", "window": 0}'},
                      follow=True).content.decode()
    # Back to the form, open, with what was typed and the error beside the parameters.
    assert '<details class="rule-form" id="rule-add" data-live-keep open>' in bad
    assert re.search(r'id="rule-parameters"[^>]*aria-invalid="true"[^>]*>\{&quot;metric&quot;: &quot;loss&quot;, '
                     r'&quot;window&quot;: 0\}</textarea>\s*<p class="field-error" role="alert" id="rule-add-error">'
                     r'parameters.window: ', bad), bad[bad.find('id="rule-add"'):][:3000]
    assert 'selected>custom</option>' in bad
    oops = client.post(f"/jobs/{job.pk}/rules/add/", {"type": "stalled", "parameters": "{oops"}, follow=True).content.decode()
    assert "parameters: must be a JSON object" in oops
    assert 'id="rule-add-error"' not in client.get(f"/jobs/{job.pk}/").content.decode()  # shown once
    client.post(f"/jobs/{job.pk}/rules/{rule.pk}/toggle/")
    rule.refresh_from_db()
    assert rule.enabled is False
    client.post(f"/jobs/{job.pk}/rules/{rule.pk}/delete/")
    assert not JobRule.objects.filter(pk=rule.pk).exists()
    assert client.get(f"/jobs/{job.pk}/rules/add/").status_code == 405


def test_a_clock_alarm_is_marked_on_the_charts_at_the_last_step_the_job_reported(client, owner, project):
    """stalled, budget, max_init_time and low GPU use fire on the clock, not on a point: the
    stored transition keeps step None and notes the step the job had reached, where the
    charts mark it (they drew no mark at all: the mark needs a step)."""
    import json
    import time

    from jobs.models import MetricChunk
    from jobs.rules.engine import Transition
    from jobs.rules.store import record

    job = make_job(project, name="quiet", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    for name, last in (("loss", 40), ("val_loss", 55)):
        MetricChunk.objects.create(job=job, name=name, chunk=0, count=3, first_step=1, first_value=1.0, last_step=last,
                                   last_value=0.5)
    other = make_job(project, name="busy", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    MetricChunk.objects.create(job=other, name="loss", chunk=9, count=1, first_step=2400, first_value=1.0,
                               last_step=2400, last_value=0.5)
    stalled = JobRule.objects.create(job=job, name="stalled", type="stalled", state=RuleState.OK)
    curve = JobRule.objects.create(job=job, name="nan", type="non_finite", state=RuleState.OK)
    now = time.time()
    [row] = record(stalled, [Transition("OK", "ALARM", now, "no metric or log line for 31 s (limit 30 s)",
                                        {"silent_seconds": 31.0}, None)])
    assert row.step is None and row.values == {"silent_seconds": 31.0, "step_reached": 55}
    [point] = record(curve, [Transition("OK", "ALARM", now, "loss was NaN at step 7", {"metric": "loss"}, 7)])
    assert point.step == 7 and "step_reached" not in point.values
    client.force_login(owner)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    marks = json.loads(re.search(r'<script id="rule-marks" type="application/json">(.*?)</script>', html, re.S)[1])
    assert {(m["rule"], m["step"], m["metric"]) for m in marks} == {("stalled", 55, None), ("nan", 7, "loss")}
    strip = re.search(r'<ol class="events-strip" id="rule-events">(.*?)</ol>', html, re.S)[1]
    assert "stalled</span> after step 55" in strip and "nan</span> at step 7" in strip


def test_the_add_a_rule_form_says_when_each_action_acts_and_picks_the_notify_states_and_channels(client, teammate,
                                                                                                 project):
    """The form's legend said "Actions on ALARM" while notify sent every transition, and it
    offered no channel: its notify now takes the states (`on`) and the channels."""
    from studio.models import NotificationChannel

    NotificationChannel.objects.create(project=project, name="ops", kind="webhook", url="http://127.0.0.1:9/hook")
    NotificationChannel.objects.create(project=project, name="pager", kind="email", emails=["a@example.com"])
    job = make_job(project, name="running", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())
    client.force_login(teammate)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    form = html[html.find('id="rule-add"'):]
    assert "Actions on ALARM" not in form and "stop the job when the rule enters ALARM" in form
    assert re.search(r'name="notify_on" value="ALARM" checked', form) and re.search(r'name="notify_on" value="OK" checked', form)
    assert re.search(r'name="notify_on" value="INSUFFICIENT_DATA">', form), "the start's INSUFFICIENT_DATA → OK is not sent"
    assert 'name="channels" value="ops"' in form and 'name="channels" value="pager"' in form

    client.post(f"/jobs/{job.pk}/rules/add/", {"type": "stalled", "name": "quiet", "actions": ["notify"],
                                               "notify_on": ["ALARM"], "channels": ["pager"]})
    assert JobRule.objects.get(job=job, name="quiet").actions == [{"type": "notify", "channels": ["pager"], "on": ["ALARM"]}]
    client.post(f"/jobs/{job.pk}/rules/add/", {"type": "stalled", "name": "all", "actions": ["notify", "stop"],
                                               "notify_on": ["ALARM", "OK", "INSUFFICIENT_DATA"]})
    assert JobRule.objects.get(job=job, name="all").actions == [{"type": "stop"}, {"type": "notify", "channels": None}]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "notify pager on ALARM" in page and "stop on ALARM, notify all channels on every change" in page
    refused = client.post(f"/jobs/{job.pk}/rules/add/", {"type": "stalled", "name": "none", "actions": ["notify"]},
                          follow=True).content.decode()
    assert "tick at least one state to notify on" in refused and not JobRule.objects.filter(job=job, name="none").exists()
    assert not re.search(r'name="notify_on" value="ALARM" checked', refused[refused.find('id="rule-add"'):]), \
        "the form comes back as it was sent"
