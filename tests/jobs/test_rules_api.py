"""Rules through the API: in the job spec and on a running job; bad parameters are a 400
naming the field; roles; a finished job's rules are fixed; the alarms list."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import AlarmTransition, JobRule, JobStatus, RuleState, TrainingJob
from tests.factories import make_job, make_version


@pytest.fixture
def version(project, owner, tmp_path):
    table = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(60))
    return make_version(project, tmp_path, {"train.csv": table}, name="tiny", user=owner)


def body(version, **overrides) -> dict:
    return {"project": "acme", "name": "ruled", "algorithm": "tabular-classifier", "hyperparameters": {"epochs": 2},
            "inputs": {"train": {"dataset_version": version.pk}}, **overrides}


@pytest.fixture
def running(project):
    return make_job(project, name="running", submitted=True, status=JobStatus.TRAINING, started_at=timezone.now())


def test_a_submission_gets_the_default_rule_and_its_own(owner, client_for, version):
    rules = [{"name": "plateau", "type": "loss_not_decreasing", "parameters": {"num_steps": 20}, "actions": ["notify"]}]
    response = client_for(owner).post("/api/v1/jobs/", body(version, rules=rules), format="json")
    assert response.status_code == 201, response.json()
    got = {r["name"]: r for r in response.json()["rules"]}
    assert set(got) == {"plateau", "non_finite"}
    assert got["plateau"]["parameters"]["num_steps"] == 20
    assert got["plateau"]["parameters"]["diff_percent"] == 0.1  # the default filled in
    assert got["plateau"]["actions"] == [{"type": "notify", "channels": None}] or got["plateau"]["actions"][0]["type"] == "notify"
    assert got["non_finite"]["actions"] == [{"type": "stop"}]
    assert all(r["state"] == "INSUFFICIENT_DATA" and r["state_reason"].startswith("waiting for") for r in got.values())
    # Clone and tune keep them: the submission a job came from carries its rules.
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert {r["name"] for r in job.as_submission()["rules"]} == {"plateau", "non_finite"}


@pytest.mark.parametrize(("rules", "field"), [
    ([{"type": "nope"}], "rules[0].type"),
    ([{"type": "custom", "parameters": {"threshold": 1}}], "rules[0].parameters.metric"),
    ([{"type": "custom", "parameters": {"metric": "loss", "threshold": "NaN"}}], "rules[0].parameters.threshold"),
    ([{"type": "custom", "parameters": {"metric": "loss", "threshold": 1, "window": 0}}], "rules[0].parameters.window"),
    ([{"type": "custom", "parameters": {"metric": "loss", "threshold": 1, "datapoints_to_alarm": 4,
                                        "evaluation_periods": 3}}], "rules[0].parameters.datapoints_to_alarm"),
    ([{"type": "stalled", "parameters": {"threshold_seconds": True}}], "rules[0].parameters.threshold_seconds"),
    ([{"type": "stalled", "bogus": 1}], "rules[0].bogus"),
    ([{"type": "stalled"}, {"type": "stalled"}], "rules[1].name"),
    ([{"type": "stalled", "actions": ["explode"]}], "rules[0].actions[0]"),
    ([5], "rules[0]"),
])
def test_a_bad_rule_is_a_400_naming_the_field_and_creates_nothing(owner, client_for, version, rules, field):
    response = client_for(owner).post("/api/v1/jobs/", body(version, rules=rules), format="json")
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert any(name == field or name.startswith(field) for name in fields), fields
    assert not TrainingJob.objects.exists()


def test_rules_on_a_running_job_add_change_and_delete(owner, teammate, viewer, client_for, running):
    url = f"/api/v1/jobs/{running.pk}/rules/"
    rule = {"name": "too-high", "type": "custom", "parameters": {"metric": "loss", "threshold": 5, "comparison": ">"},
            "actions": ["stop"]}
    assert client_for(viewer).post(url, rule, format="json").status_code == 403
    created = client_for(teammate).post(url, rule, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["state"] == "INSUFFICIENT_DATA"
    assert client_for(teammate).post(url, rule, format="json").json()["error"]["fields"].keys() == {"name"}

    listed = client_for(viewer).get(url).json()
    assert [r["name"] for r in listed["results"]] == ["too-high"]

    changed = client_for(teammate).patch(url, {"name": "too-high", "parameters": {"threshold": 9}}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["parameters"]["threshold"] == 9 and changed.json()["parameters"]["metric"] == "loss"
    bad = client_for(teammate).patch(url, {"name": "too-high", "parameters": {"window": -1}}, format="json")
    assert bad.status_code == 400 and "parameters.window" in bad.json()["error"]["fields"]
    retyped = client_for(teammate).patch(url, {"name": "too-high", "type": "stalled"}, format="json")
    assert retyped.status_code == 400 and "type" in retyped.json()["error"]["fields"]
    assert client_for(teammate).patch(url, {"name": "nobody", "enabled": False}, format="json").status_code == 404
    assert client_for(teammate).patch(url, {"enabled": False}, format="json").status_code == 400

    rule_id = created.json()["id"]
    one = client_for(teammate).patch(f"{url}{rule_id}/", {"enabled": False}, format="json")
    assert one.status_code == 200 and one.json()["enabled"] is False
    assert client_for(viewer).delete(f"{url}{rule_id}/").status_code == 403
    assert client_for(teammate).delete(f"{url}{rule_id}/").status_code == 204
    assert not JobRule.objects.filter(pk=rule_id).exists()


def test_a_finished_jobs_rules_are_fixed(teammate, client_for, project):
    job = make_job(project, name="done", submitted=True, status=JobStatus.COMPLETED, finished_at=timezone.now())
    rule = JobRule.objects.create(job=job, name="x", type="stalled", parameters={"threshold_seconds": 5})
    url = f"/api/v1/jobs/{job.pk}/rules/"
    assert client_for(teammate).post(url, {"type": "stalled"}, format="json").status_code == 409
    assert client_for(teammate).patch(f"{url}{rule.pk}/", {"enabled": False}, format="json").status_code == 409
    assert client_for(teammate).delete(f"{url}{rule.pk}/").status_code == 409


@pytest.mark.parametrize("payload", [[], "text", [{"type": "stalled"}], {"type": None}, {"type": "stalled", "name": ""},
                                     {"type": "stalled", "name": "x" * 500}, {"type": "stalled", "name": "a\x00b"},
                                     b'{"type": "custom", "parameters": {"metric": "loss", "threshold": 1e400}}',
                                     b'{"type": "custom", "parameters": {"metric": "loss", "threshold": NaN}}',
                                     b'{"type": "stalled", "parameters": {"threshold_seconds": 1e999999}}',
                                     {"type": "custom", "parameters": []}, {"type": "stalled", "actions": "stop"}])
def test_odd_bodies_are_400s(teammate, client_for, running, payload):
    url = f"/api/v1/jobs/{running.pk}/rules/"
    client = client_for(teammate)
    if isinstance(payload, bytes):
        response = client.generic("POST", url, payload, content_type="application/json")
    else:
        response = client.post(url, payload, format="json")
    assert response.status_code == 400, (payload, response.status_code, response.content[:300])


def test_another_projects_job_rules_are_not_found(outsider, client_for, running):
    assert client_for(outsider).get(f"/api/v1/jobs/{running.pk}/rules/").status_code == 404
    assert client_for(outsider).post(f"/api/v1/jobs/{running.pk}/rules/", {"type": "stalled"}, format="json").status_code == 404


def test_the_alarms_list_shows_what_is_firing_in_readable_projects(viewer, outsider, client_for, running, project):
    firing = JobRule.objects.create(job=running, name="hot", type="stalled", state=RuleState.ALARM,
                                    state_reason="silent", state_changed_at=timezone.now())
    JobRule.objects.create(job=running, name="calm", type="stalled", state=RuleState.OK)
    AlarmTransition.objects.create(rule=firing, job=running, from_state="OK", to_state="ALARM", reason="silent")
    listed = client_for(viewer).get("/api/v1/alarms/").json()
    assert [(r["name"], r["job"]["name"]) for r in listed["results"]] == [("hot", "running")]
    assert client_for(viewer).get("/api/v1/alarms/?state=OK").json()["count"] == 1
    assert client_for(viewer).get("/api/v1/alarms/?state=WEIRD").status_code == 400
    assert client_for(viewer).get("/api/v1/alarms/?finished=maybe").status_code == 400
    TrainingJob.objects.filter(pk=running.pk).update(status=JobStatus.STOPPED)
    assert client_for(viewer).get("/api/v1/alarms/").json()["count"] == 0  # history now, not firing
    assert client_for(viewer).get("/api/v1/alarms/?finished=true").json()["count"] == 1
    TrainingJob.objects.filter(pk=running.pk).update(status=JobStatus.TRAINING)
    assert client_for(outsider).get("/api/v1/alarms/").json()["count"] == 0
    transitions = client_for(viewer).get(f"/api/v1/jobs/{running.pk}/alarm-transitions/").json()
    assert [(t["rule"], t["to_state"]) for t in transitions["results"]] == [("hot", "ALARM")]


def test_a_notify_action_must_name_the_projects_channels(owner, teammate, client_for, version, running, project):
    from studio.models import NotificationChannel

    NotificationChannel.objects.create(project=project, name="ops", kind="webhook", url="http://127.0.0.1:9/hook")
    NotificationChannel.objects.create(project=project, name="paused", kind="webhook", url="http://127.0.0.1:9/x",
                                       enabled=False)
    misspelt = [{"type": "stalled"}, {"type": "custom", "parameters": {"metric": "loss", "threshold": 1},
                                      "actions": ["tag", {"type": "notify", "channels": ["ops", "opps"]}]}]
    response = client_for(owner).post("/api/v1/jobs/", body(version, rules=misspelt), format="json")
    assert response.status_code == 400, response.json()
    message = response.json()["error"]["fields"]["rules[1].actions[1].channels[1]"][0]
    assert "'opps'" in message and "'ops'" in message and "'paused'" in message, message
    assert not TrainingJob.objects.filter(name="ruled").exists()
    # A disabled channel is still the project's (an admin may turn it back on).
    named = [{"type": "stalled", "actions": [{"type": "notify", "channels": ["ops", "paused"]}]}]
    assert client_for(owner).post("/api/v1/jobs/", body(version, rules=named), format="json").status_code == 201

    url = f"/api/v1/jobs/{running.pk}/rules/"
    added = client_for(teammate).post(url, {"type": "stalled", "actions": [{"type": "notify", "channels": ["nope"]}]},
                                      format="json")
    assert added.status_code == 400 and set(added.json()["error"]["fields"]) == {"actions[0].channels[0]"}, added.json()
    assert not JobRule.objects.filter(job=running).exists()
    assert client_for(teammate).post(url, {"type": "stalled", "actions": ["notify"]}, format="json").status_code == 201
    changed = client_for(teammate).patch(url, {"name": "stalled", "actions": [{"type": "notify", "channels": ["x"]}]},
                                         format="json")
    assert changed.status_code == 400 and set(changed.json()["error"]["fields"]) == {"actions[0].channels[0]"}
    assert JobRule.objects.get(job=running).actions == [{"type": "notify", "channels": None}]


@pytest.mark.django_db(transaction=True)
def test_a_flapping_rule_leaves_at_most_its_share_of_the_timeline(running):
    from jobs.models import JobEvent
    from jobs.rules.actions import TIMELINE_NOTES_PER_RULE
    from jobs.rules.engine import ALARM, OK, Transition
    from jobs.rules.store import add_rule, record

    rule = add_rule(running.pk, {"name": "flappy", "type": "stalled"}, job_finished=False, project_id=running.project_id)
    other = add_rule(running.pk, {"name": "flappy2", "type": "stalled"}, job_finished=False, project_id=running.project_id)
    now = timezone.now().timestamp()
    flips = [Transition(OK if i % 2 else ALARM, ALARM if i % 2 else OK, now + i, f"flip {i}", {"i": i}, i) for i in range(1, 61)]
    for t in flips:
        record(rule, [t])
    record(other, flips[:1])
    notes = list(JobEvent.objects.filter(job=running, message__startswith="rule flappy: ").values_list("message", flat=True))
    assert len(notes) == TIMELINE_NOTES_PER_RULE + 1
    assert "left out of the timeline" in notes[-1] and "alarm-transitions" in notes[-1]
    assert AlarmTransition.objects.filter(rule=rule).count() == 60  # the history keeps every one
    assert JobEvent.objects.filter(job=running, message__startswith="rule flappy2: ").count() == 1


def test_renaming_a_rule_moves_its_default_tag_and_keeps_a_chosen_one(teammate, client_for, running):
    url = f"/api/v1/jobs/{running.pk}/rules/"
    client = client_for(teammate)
    made = client.post(url, {"name": "vl", "type": "stalled", "actions": ["tag", {"type": "tag", "tag": "mine"}]},
                       format="json")
    assert made.json()["actions"] == [{"type": "tag", "tag": "alarm:vl"}, {"type": "tag", "tag": "mine"}], made.json()
    renamed = client.patch(f"{url}{made.json()['id']}/", {"name": "vl2"}, format="json")
    assert renamed.status_code == 200, renamed.json()
    assert renamed.json()["actions"] == [{"type": "tag", "tag": "alarm:vl2"}, {"type": "tag", "tag": "mine"}]


def test_a_budget_under_a_cent_is_not_called_zero():
    from jobs.rules.common import _fmt_cost

    assert _fmt_cost(1e-06) == "1e-06" and _fmt_cost(0.5) == "0.50" and _fmt_cost(0) == "0.00" and _fmt_cost(12.345) == "12.35"


def _request_schema(client, path: str, method: str):
    """The validator of an operation's JSON request body, with the schema's components."""
    import jsonschema

    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**body, "components": schema["components"]})


def test_the_bodies_the_rules_api_takes_are_valid_under_its_schema(owner, client_for, version, running):
    """A new user's generated client refused what the API takes: a rule in the spec given as
    a bare type name, and PATCH /jobs/<id>/rules/ naming the rule by "id"."""
    client = client_for(owner)
    submit = _request_schema(client, "/api/v1/jobs/", "post")
    spec = body(version, rules=["stalled", {"type": "max_init_time", "parameters": {"threshold_seconds": 60}}])
    assert not list(submit.iter_errors(spec)), [error.message for error in submit.iter_errors(spec)]
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.json()
    assert {rule["name"] for rule in response.json()["rules"]} == {"stalled", "max_init_time", "non_finite"}
    assert not submit.is_valid(body(version, rules=[5])), "the schema refuses what the API refuses"
    assert not submit.is_valid(body(version, rules=["nope"]))

    change = _request_schema(client, "/api/v1/jobs/{id}/rules/", "patch")
    rule = JobRule.objects.filter(job=running).first() or JobRule.objects.create(
        job=running, name="stalled", type="stalled", parameters={"threshold_seconds": 10})
    for patch in ({"id": rule.pk, "enabled": False}, {"name": rule.name, "new_name": "quiet"}):
        assert change.is_valid(patch), [error.message for error in change.iter_errors(patch)]
        response = client.patch(f"/api/v1/jobs/{running.pk}/rules/", patch, format="json")
        assert response.status_code == 200, response.json()
    rule.refresh_from_db()
    assert rule.name == "quiet" and rule.enabled is False
    assert not change.is_valid({"id": "one"})
    # Beside an id, new_name renames too (the schema offers both in one body).
    patch = {"id": rule.pk, "new_name": "hushed"}
    assert change.is_valid(patch)
    response = client.patch(f"/api/v1/jobs/{running.pk}/rules/", patch, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["name"] == "hushed"
    twice = client.patch(f"/api/v1/jobs/{running.pk}/rules/", {**patch, "name": "other"}, format="json")
    assert twice.status_code == 400 and "new_name" in twice.json()["error"]["fields"]
    # A key the API refuses, the schema refuses too.
    assert not change.is_valid({"id": rule.pk, "bogus": 1})
    assert not submit.is_valid(body(version, rules=[{"type": "stalled", "bogus": 1}]))


def test_a_patch_leaves_out_what_it_does_not_change_and_says_so_in_the_rules_reason(teammate, client_for, running):
    """Seen through a generated client: the schema gave PATCH's `enabled` a default of true,
    so a client sending its model whole turned a rule that was off back on; the reason kept
    the old definition's verdict; a rename clash was reported on `name`, not `new_name`."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path, name in (("/api/v1/jobs/{id}/rules/{rule_id}/", "patch"), ("/api/v1/jobs/{id}/rules/", "patch")):
        operation = schema["paths"][path][name]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        enabled = schema["components"]["schemas"][ref]["properties"]["enabled"]
        assert "default" not in enabled and not schema["components"]["schemas"][ref].get("required"), (path, ref, enabled)

    client = client_for(teammate)
    url = f"/api/v1/jobs/{running.pk}/rules/"
    made = client.post(url, {"name": "high", "type": "custom", "parameters": {"metric": "loss", "threshold": 2}},
                       format="json").json()
    JobRule.objects.filter(pk=made["id"]).update(state=RuleState.ALARM, state_reason="loss 5 > 2 (1 of 1 points)")
    client.post(url, {"name": "other", "type": "stalled"}, format="json")

    off = client.patch(f"{url}{made['id']}/", {"enabled": False}, format="json").json()
    assert off["enabled"] is False and off["state_reason"].startswith("Turned off at "), off["state_reason"]
    renamed = client.patch(f"{url}{made['id']}/", {"name": "higher"}, format="json").json()
    assert renamed["enabled"] is False, "a rename alone keeps it off"
    changed = client.patch(url, {"name": "higher", "parameters": {"threshold": 9}}, format="json").json()
    assert changed["enabled"] is False and changed["parameters"]["threshold"] == 9
    on = client.patch(url, {"name": "higher", "enabled": True}, format="json").json()
    assert on["state_reason"].startswith("Turned on at ") and "ALARM until then" in on["state_reason"], on["state_reason"]
    redefined = client.patch(url, {"name": "higher", "parameters": {"threshold": 10}}, format="json").json()
    assert redefined["state_reason"].startswith("Changed at ") and "ALARM until then" in redefined["state_reason"], redefined

    clash = client.patch(url, {"name": "higher", "new_name": "other"}, format="json")
    assert clash.status_code == 400 and set(clash.json()["error"]["fields"]) == {"new_name"}, clash.json()
    clash_by_id = client.patch(f"{url}{made['id']}/", {"name": "other"}, format="json")
    assert clash_by_id.status_code == 400 and set(clash_by_id.json()["error"]["fields"]) == {"name"}, clash_by_id.json()


def test_channel_names_in_rules_match_without_case_and_a_renamed_channel_never_locks_a_rule(teammate, owner, client_for,
                                                                                          running, project):
    """Seen in a re-walk: with the channel named "OPS", a rule naming "ops" was refused
    (names are unique without case, yet looked up with it); and once a channel a rule named
    was renamed or deleted, every PATCH of the rule, turning it off included, was a 400."""
    from studio.models import Delivery, NotificationChannel

    channel = NotificationChannel.objects.create(project=project, name="OPS", kind="webhook",
                                                 url="http://hooks.example.com/x")
    client = client_for(teammate)
    url = f"/api/v1/jobs/{running.pk}/rules/"
    made = client.post(url, {"name": "quiet", "type": "stalled", "actions": [{"type": "notify", "channels": ["ops"]}]},
                       format="json")
    assert made.status_code == 201, made.json()
    from jobs.rules.actions import _notify
    from jobs.rules.engine import Transition

    rule = JobRule.objects.get(pk=made.json()["id"])
    row = AlarmTransition.objects.create(rule=rule, job=running, from_state="OK", to_state="ALARM", at=timezone.now(),
                                         reason="quiet", values={})
    taken = _notify(rule, running, row, Transition("OK", "ALARM", 0.0, "quiet", {}, None), ["ops"])
    assert taken["deliveries"] and Delivery.objects.get(pk=taken["deliveries"][0]).channel == channel, taken

    assert client_for(owner).patch(f"/api/v1/projects/{project.slug}/notification-channels/{channel.pk}/",
                                   {"name": "pager"}, format="json").status_code == 200
    off = client.patch(f"{url}{rule.pk}/", {"enabled": False}, format="json")
    assert off.status_code == 200 and off.json()["enabled"] is False, off.json()
    assert off.json()["state_reason"].startswith("Turned off")
    changed = client.patch(f"{url}{rule.pk}/", {"parameters": {"threshold_seconds": 900}}, format="json").json()
    assert changed["state_reason"].startswith("Changed at ") and "while off" in changed["state_reason"], changed
    # A name the change brings is still checked.
    added = client.patch(f"{url}{rule.pk}/", {"actions": [{"type": "notify", "channels": ["ops", "nobody"]}]},
                         format="json")
    assert added.status_code == 400 and set(added.json()["error"]["fields"]) == {"actions[0].channels[1]"}, added.json()
    born_off = client.post(url, {"name": "later", "type": "stalled", "enabled": False}, format="json").json()
    assert born_off["state_reason"].startswith("Off: not evaluated"), born_off["state_reason"]
