"""The OpenAPI schema tells the truth: schemathesis generates requests
for EVERY operation of /api/schema/ and checks each answer against the schema — no 5xx,
only documented status codes, bodies that match their documented schema, and documented
content types.

It runs in-process (WSGI) against the test database, signed in with the bearer token of
a project admin, over seeded objects (a project, a dataset version, a Completed job with a
real model, a model, an endpoint, a work team, a flow, a human loop, an assignment, a
tuning job, a batch prediction, a node): every example is sent twice, once as generated
(mostly 4xx: unknown ids, bad fields) and once with its path parameters pointing at the
seeded objects and `project` naming the seeded project, so the operations get past 404s.
Each request runs in a savepoint that is rolled back, so every one sees the seeded state.
All operations run in one test (one seeding); its failure lists every failing operation.

Budget: STUDIO_FUZZ_EXAMPLES examples per operation (default 10) — a couple of minutes.
Set STUDIO_FUZZ_SEED to explore other examples than CI's (derandomized by default)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, seed, settings

from evaluations.actions import submit_evaluation
from evaluations.run import run_evaluation
from hosting import actions as hosting_actions
from hosting.models import BatchPrediction, BatchStatus
from jobs.models import AlarmTransition, ClusterSample, InstancePrice, JobEvent, JobRule, MetricPoint, Node
from review.actions.claims import claim_next_slot
from review.actions.loops import start_human_loop
from review.actions.teams import create_flow_definition, create_work_team
from studio import actions as studio_actions
from studio.models import NotificationChannel, Role
from tests.factories import make_member
from tests.hosting.conftest import demo_job, demo_model_artifact, demo_version, fresh_predictors, model_cache_dir  # noqa: F401
from tuning.models import TuningJob, TuningStatus

pytestmark = pytest.mark.django_db
EXAMPLES = int(os.environ.get("STUDIO_FUZZ_EXAMPLES", "10"))
SEED = os.environ.get("STUDIO_FUZZ_SEED")


def served_schema() -> dict:
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return response.json()


schema = schemathesis.openapi.from_dict(served_schema())
CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.response_schema_conformance, schemathesis.checks.content_type_conformance]


@dataclass
class Seeded:
    token: str
    slug: str
    ids: dict[str, object] = field(default_factory=dict)  # tag (resource) -> the id of its seeded object
    names: dict[str, str] = field(default_factory=dict)   # tag -> the name of its seeded object
    extra: dict[str, object] = field(default_factory=dict)  # other path parameters: number, path, slug


@pytest.fixture
def seeded(project, owner, demo_job, demo_version) -> Seeded:  # noqa: F811 - fixtures imported above
    token, raw_token = studio_actions.issue_token(owner, name="fuzz")
    reviewer = make_member(project, "fuzz-reviewer", Role.REVIEWER)
    MetricPoint.objects.create(job=demo_job, name="loss", rank=0, step=1, value=0.5, time=timezone.now())
    JobEvent.objects.create(job=demo_job, status=demo_job.status, message="Completed")
    version = hosting_actions.register_model(project=project, name="demo", job=demo_job, user=owner)
    endpoint = hosting_actions.create_endpoint(project=project, name="demo-ep", model_version=version, user=owner)
    team = create_work_team(project=project, name="labellers", members=[owner, reviewer], user=owner)
    flow = create_flow_definition(project=project, user=owner, data={
        "name": "check", "task_type": "classification", "labels": ["a", "b"], "title": "Which?", "instructions": "",
        "task_count": 1, "task_availability_seconds": 3600, "task_time_limit_seconds": 60, "work_team": team,
        "activation": {"confidence_below": 0.8, "sample_percent": 0.0, "combine": "any"}, "order": "oldest",
        "show_prediction": True})
    loop = start_human_loop(name="loop-1", flow=flow, input_content={"text": "hello"}, user=owner)
    start_human_loop(name="loop-2", flow=flow, input_content={"text": "world"}, user=owner)
    assignment = claim_next_slot(owner, flow)
    assert assignment is not None
    tuning = TuningJob.objects.create(
        project=project, name="search", status=TuningStatus.COMPLETED, strategy="random",
        base_job={"algorithm": "tabular-classifier", "hyperparameters": {"epochs": 1}, "inputs": {},
                  "resources": {"instance_type": "cpu"}},
        parameter_ranges={"learning_rate": {"type": "continuous", "min": 0.001, "max": 0.1}},
        objective={"metric": "validation_accuracy", "goal": "maximize"}, max_trials=2, max_parallel=1, created_by=owner)
    batch = BatchPrediction.objects.create(project=project, model_version=version, dataset_version=demo_version,
                                           status=BatchStatus.COMPLETED, created_by=owner)
    node = Node.objects.create(name="node-a", hostname="h", queue="node.node-a")
    evaluation = submit_evaluation(project=project, user=owner, body={
        "model_version": version.pk, "dataset_version": demo_version.pk, "target_error": 0.1, "flow_definition": flow.pk})
    assert run_evaluation(evaluation.pk) == "Completed"
    # Rules, alarms, notification channels, prices and cluster samples (issue 17).
    rule = JobRule.objects.create(job=demo_job, name="non_finite", type="non_finite", parameters={"metrics": "(?i)loss"},
                                  actions=[{"type": "stop"}], state="ALARM", state_reason="loss was NaN at step 3")
    AlarmTransition.objects.create(rule=rule, job=demo_job, from_state="OK", to_state="ALARM", step=3,
                                   reason="loss was NaN at step 3", values={"value": "NaN"})
    channel = NotificationChannel.objects.create(project=project, name="ops", kind="webhook",
                                                 url="http://127.0.0.1:9/hook", secret="fuzz-secret")
    InstancePrice.objects.create(project=project, instance_type="cpu", price_per_node_hour="0.25")
    ClusterSample.objects.create(queue_depth=1, nodes={"node-a": {"state": "idle", "cpu_percent": 5.0}})
    return Seeded(
        token=raw_token, slug=project.slug,
        ids={"jobs": demo_job.pk, "datasets": demo_version.dataset_id, "dataset-versions": demo_version.pk,
             "models": version.model_id, "tuning-jobs": tuning.pk, "flow-definitions": flow.pk, "work-teams": team.pk,
             "batch-predictions": batch.pk, "tokens": token.pk, "review": assignment.pk, "evaluations": evaluation.pk,
             "model-versions": version.pk, "projects": channel.pk},
        names={"endpoints": endpoint.name, "human-loops": loop.name, "nodes": node.name},
        extra={"slug": project.slug, "number": version.version, "path": demo_version.files[0]["path"],
               "rule_id": rule.pk, "instance_type": "cpu"},
    )


@pytest.fixture
def wsgi_in_test_transaction():
    """Django's WSGI handler serves in this test's transaction: like django.test.Client,
    it must not close the connection at the start and end of each request."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def aimed(case, seeded: Seeded) -> dict[str, object]:
    """The case's path parameters pointed at the seeded objects of its resource."""
    tag = (case.operation.tags or [""])[0]
    values: dict[str, object] = {}
    for name in case.path_parameters or {}:
        if name in ("id", "pk") and tag in seeded.ids:
            values[name] = seeded.ids[tag]
        elif name == "name" and tag in seeded.names:
            values[name] = seeded.names[tag]
        elif name in seeded.extra:
            values[name] = seeded.extra[name]
        else:
            values[name] = case.path_parameters[name]
    return values


def call_and_check(case, app, seeded: Seeded) -> None:
    """One request, in a savepoint rolled back after it: every example starts from the
    seeded objects (a DELETE does not take them away from the next one), and a database
    error in one does not poison the next."""
    headers = {"Authorization": f"Bearer {seeded.token}"}
    with transaction.atomic():
        response = case.call(app=app, headers=headers, base_url="http://testserver")
        transaction.set_rollback(True)
    case.validate_response(response, checks=CHECKS)


def examples(case, seeded: Seeded) -> None:
    """The case as generated, then aimed at the seeded objects."""
    call_and_check(case, APP, seeded)
    if case.path_parameters:
        case.path_parameters = aimed(case, seeded)
    if case.query and "project" in case.query:
        case.query = {**case.query, "project": seeded.slug}
    if isinstance(case.body, dict) and "project" in case.body:
        case.body = {**case.body, "project": seeded.slug}
    call_and_check(case, APP, seeded)


fuzz_settings = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
APP = WSGIHandler()


def failure_lines(label: str, exc: BaseException) -> list[str]:
    """One line per distinct failure schemathesis reported for the operation."""
    found = getattr(exc, "exceptions", None) or [exc]
    lines = []
    for failure in found:
        title = getattr(failure, "title", type(failure).__name__)
        message = str(getattr(failure, "message", failure)).strip().splitlines()
        lines.append(f"{label}: {title}: {message[0][:300] if message else ''}")
    return lines


def test_every_operation_answers_as_documented(seeded, wsgi_in_test_transaction):
    operations = [result.ok() for result in schema.get_all_operations()]
    failures: list[str] = []
    for operation in operations:
        label = f"{operation.method.upper()} {operation.path}"

        @given(case=operation.as_strategy())
        @fuzz_settings
        def fuzz(case):
            examples(case, seeded)

        if SEED is not None:
            fuzz = seed(int(SEED))(fuzz)
        try:
            fuzz()
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - every operation is fuzzed; all failures listed
            failures.extend(failure_lines(label, exc))
    summary = (f"{len(operations)} operations, {EXAMPLES} examples each (x2 calls): "
               f"{len(failures)} failures" + "".join(f"\n  {line}" for line in failures))
    print(summary)
    assert not failures, summary


def test_every_operation_is_fuzzed():
    """The loop above covers every operation the schema serves."""
    served = served_schema()
    operations = {(method.upper(), path) for path, item in served["paths"].items() for method in item
                  if method in ("get", "post", "put", "patch", "delete")}
    fuzzed = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert operations == fuzzed
    assert len(operations) >= 60
    assert all(re.match(r"^/api/v1/", path) for _, path in operations)
