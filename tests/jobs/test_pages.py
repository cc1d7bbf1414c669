"""Job pages through Django's test client: who sees what, what the filters keep, what a
clone pre-fills, what compare shows, what is escaped, and what the downloads serve."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from datasets.storage import join_uri, object_uri, store_for
from jobs.models import JobStatus, TrainingJob
from jobs.transitions import transition
from tests import factories

XSS = "<script>alert('pwned')</script>"
FLOWERS_CSV = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(40))


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_version(project, user, tmp_path: Path, name: str = "flowers", validate: bool = True):
    return factories.make_version(project, tmp_path, {"train.csv": FLOWERS_CSV}, name=name, user=user, validate=validate)


@pytest.fixture
def version(project, owner, tmp_path):
    return make_version(project, owner, tmp_path)


make_job = factories.submitted_job


def rows_of(body: str, table_id: str) -> str:
    match = re.search(rf'<table[^>]*id="{table_id}".*?</table>', body, re.S)
    assert match, f"no table {table_id}"
    return match.group(0)


# --- access -----------------------------------------------------------------------------------
def test_job_pages_require_login(owner, project, version):
    job = make_job(project, owner, version)
    other = make_job(project, owner, version)
    for url in (reverse("job-list"), reverse("job-create"), reverse("job-detail", args=[job.pk]),
                reverse("job-model", args=[job.pk]), reverse("job-logs", args=[job.pk]),
                reverse("job-compare") + f"?ids={job.pk},{other.pk}"):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_viewer_reads_but_sees_no_new_stop_or_clone(owner, viewer, project, version):
    job = make_job(project, owner, version, status=JobStatus.TRAINING)
    client = login(viewer)
    listing = client.get(reverse("job-list")).content.decode()
    assert job.name in listing
    assert f'href="{reverse("job-create")}"' not in listing
    detail = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    assert 'id="stop-job"' not in detail and "?clone=" not in detail
    assert client.get(reverse("job-create")).status_code == 403


def test_scientist_gets_stop_while_running_and_clone_always(owner, teammate, project, version):
    running = make_job(project, owner, version, status=JobStatus.TRAINING)
    done = make_job(project, owner, version, status=JobStatus.COMPLETED)
    client = login(teammate)
    body = client.get(reverse("job-detail", args=[running.pk])).content.decode()
    assert 'id="stop-job"' in body and f'data-stop-url="{reverse("api-job-stop", args=[running.pk])}"' in body
    assert f'{reverse("job-create")}?clone={running.pk}' in body
    finished = client.get(reverse("job-detail", args=[done.pk])).content.decode()
    assert 'id="stop-job"' not in finished and f"?clone={done.pk}" in finished


def test_outsider_gets_404_on_every_job_page(owner, outsider, project, version):
    job = make_job(project, owner, version, name="acme-secret")
    other = make_job(project, owner, version)
    client = login(outsider)
    assert client.get(reverse("job-detail", args=[job.pk])).status_code == 404
    assert client.get(reverse("job-model", args=[job.pk])).status_code == 404
    assert client.get(reverse("job-logs", args=[job.pk])).status_code == 404
    assert client.get(reverse("job-compare") + f"?ids={job.pk},{other.pk}").status_code == 404
    assert client.get(reverse("job-create") + f"?clone={job.pk}").status_code == 404
    assert job.name not in client.get(reverse("job-list")).content.decode()


def test_compare_with_one_unreadable_job_is_404(owner, outsider, project, other_project, version, tmp_path):
    mine = make_job(other_project, outsider, make_version(other_project, outsider, tmp_path, name="theirs"))
    theirs = make_job(project, owner, version)
    assert login(outsider).get(reverse("job-compare") + f"?ids={mine.pk},{theirs.pk}").status_code == 404


# --- list ---------------------------------------------------------------------------------------
def test_list_filters_by_status_algorithm_dataset_tag_and_name(owner, project, version, tmp_path):
    other_version = make_version(project, owner, tmp_path, name="birds")
    make_job(project, owner, version, name="alpha", tags=["baseline"], status=JobStatus.COMPLETED)
    make_job(project, owner, other_version, name="beta", tags=["baseline-2"])
    make_job(project, owner, version, name="gamma", tags=["wide"], status=JobStatus.FAILED)
    client = login(owner)

    def names(query: str) -> list[str]:
        body = client.get(reverse("job-list") + query).content.decode()
        if 'id="jobs-table"' not in body:
            return []
        return sorted(re.findall(r'class="strong">([^<]+)</a>', rows_of(body, "jobs-table")))

    assert names("") == ["alpha", "beta", "gamma"]
    assert names("?status=Completed") == ["alpha"]
    assert names("?status=Nonsense") == ["alpha", "beta", "gamma"]  # an unknown status filters nothing
    assert names(f"?dataset={other_version.dataset_id}") == ["beta"]
    assert names("?tag=baseline") == ["alpha"]  # exact tag, not a prefix
    assert names("?q=AMM") == ["gamma"]
    assert names("?algorithm=tabular-classifier&status=Failed") == ["gamma"]
    assert names("?algorithm=script") == []
    body = client.get(reverse("job-list") + "?tag=nope").content.decode()
    assert "No job matches these filters" in body and 'value="nope"' in body  # the filter stays visible


def test_list_row_shows_metric_attempt_and_duration(owner, project, version):
    job = make_job(project, owner, version, name="scored")
    started = timezone.now() - timezone.timedelta(minutes=5, seconds=12)
    TrainingJob.objects.filter(pk=job.pk).update(
        status=JobStatus.COMPLETED, attempt=2, started_at=started, finished_at=started + timezone.timedelta(minutes=5, seconds=12),
        final_metrics={"train_loss": 0.21, "validation_accuracy": 0.934},
    )
    table = rows_of(login(owner).get(reverse("job-list")).content.decode(), "jobs-table")
    assert "0.934" in table and "validation_accuracy" in table
    assert "5 min 12 s" in table
    assert 'data-status="completed"' in table and "badge--green" in table
    assert f'name="ids" value="{job.pk}"' in table  # the compare checkbox


def test_empty_list_says_how_to_start(teammate):
    body = login(teammate).get(reverse("job-list")).content.decode()
    assert "No training jobs yet" in body
    assert f'href="{reverse("job-create")}"' in body
    assert "/api/v1/jobs/" in body and "Authorization: Bearer" in body


def test_list_query_count_does_not_grow_with_jobs(owner, project, version, django_assert_max_num_queries):
    client = login(owner)
    for index in range(3):
        make_job(project, owner, version, name=f"few-{index}", tags=["t"])
    with django_assert_max_num_queries(10):
        assert client.get(reverse("job-list")).status_code == 200
    for index in range(30):
        make_job(project, owner, version, name=f"many-{index}", tags=[f"t{index}"])
    with django_assert_max_num_queries(10):
        body = client.get(reverse("job-list")).content.decode()
    assert "many-29" in body


# --- form and clone ----------------------------------------------------------------------------
def form_data(body: str) -> dict:
    match = re.search(r'<script id="job-form-data" type="application/json">(.*?)</script>', body, re.S)
    assert match
    return json.loads(match.group(1))


def test_form_offers_schemas_and_only_ready_versions(owner, project, other_project, version, tmp_path):
    pending = make_version(project, owner, tmp_path, name="unchecked", validate=False)
    body = login(owner).get(reverse("job-create")).content.decode()
    data = form_data(body)
    assert [v["id"] for v in data["versions"]] == [version.pk]
    assert version.pk != pending.pk
    tabular = next(a for a in data["algorithms"] if a["name"] == "tabular-classifier")
    assert any(hp["name"] == "epochs" and hp["type"] == "integer" for hp in tabular["hyperparameters"])
    assert data["clone"] is None
    assert 'action="/api/v1/jobs/"' in body and 'data-scripts-url="/api/v1/scripts/"' in body


def test_clone_prefills_every_field(owner, project, version):
    job = make_job(project, owner, version, name="base", tags=["small", "v2"], hyperparameters={"epochs": 7, "layers": 3},
                   resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 2}, distribution="ddp",
                   stopping={"max_runtime_seconds": 900}, checkpoint={"uri": "", "every_steps": 50},
                   environment={"MY_FLAG": "1"}, retries=2)
    body = login(owner).get(reverse("job-create") + f"?clone={job.pk}").content.decode()
    assert 'value="base-clone"' in body
    assert 'value="small, v2"' in body
    assert re.search(r'id="id_distribution".*?<option value="ddp" selected>', body, re.S)
    assert 'name="max_runtime_seconds" value="900"' in body
    assert 'name="checkpoint_every_steps" value="50"' in body
    assert 'name="processes_per_node" value="2"' in body
    assert 'name="retries" value="2"' in body
    assert "MY_FLAG=1</textarea>" in body
    clone = form_data(body)["clone"]
    assert clone["hyperparameters"]["epochs"] == 7 and clone["hyperparameters"]["layers"] == 3
    assert clone["inputs"] == {"train": {"dataset_version": version.pk, "mode": "file"}}
    assert clone["algorithm"] == "tabular-classifier"


# --- detail ----------------------------------------------------------------------------------
def test_failed_job_shows_its_reason_prominently(owner, project, version):
    job = make_job(project, owner, version, status=JobStatus.TRAINING)
    assert transition(job.pk, JobStatus.FAILED, message="exit code 1", failure_reason="ValueError: label column 'y' not found")
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    assert '<pre class="failure-reason">ValueError: label column &#x27;y&#x27; not found</pre>' in body
    timeline = re.search(r'<ol class="timeline".*?</ol>', body, re.S).group(0)
    assert timeline.count("<li>") == 2 and "exit code 1" in timeline and 'data-status="failed"' in timeline


def test_pending_job_says_why_it_waits_and_live_config_is_json(owner, project, version):
    job = make_job(project, owner, version)
    TrainingJob.objects.filter(pk=job.pk).update(waiting_reason="No 'cpu' node is running; start one with studio worker.")
    body = login(owner).get(reverse("job-detail", args=[job.pk])).content.decode()
    assert "No &#x27;cpu&#x27; node is running" in body
    live = json.loads(re.search(r'<script id="job-live" type="application/json">(.*?)</script>', body, re.S).group(1))
    assert live["urls"]["stream"] == f"/api/v1/jobs/{job.pk}/stream"
    assert "train_loss" in live["metric_names"]
    assert live["finished"] is False


def test_user_text_is_escaped_everywhere(owner, project, version):
    job = make_job(project, owner, version, name=XSS, tags=[XSS])
    other = make_job(project, owner, version, name=XSS)
    # Submit refuses a label column the data lacks; a job's stored values are shown whatever they are.
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, failure_reason=XSS, final_metrics={"acc": 0.5},
                                                 hyperparameters={**job.hyperparameters, "label_column": XSS})
    TrainingJob.objects.filter(pk=other.pk).update(hyperparameters={**other.hyperparameters, "label_column": "y"})
    client = login(owner)
    for url in (reverse("job-list"), reverse("job-detail", args=[job.pk]), reverse("job-create") + f"?clone={job.pk}",
                reverse("job-compare") + f"?ids={job.pk},{other.pk}", reverse("job-list") + "?tag=" + XSS):
        body = client.get(url).content.decode()
        assert "<script>alert" not in body, url
        assert "&lt;script&gt;alert" in body or "\\u003Cscript\\u003Ealert" in body, url


# --- compare ---------------------------------------------------------------------------------
def test_compare_shows_only_differing_hyperparameters(owner, project, version):
    first = make_job(project, owner, version, name="lr-small", hyperparameters={"epochs": 3, "learning_rate": 0.001})
    second = make_job(project, owner, version, name="lr-big", hyperparameters={"epochs": 3, "learning_rate": 0.01})
    TrainingJob.objects.filter(pk=first.pk).update(final_metrics={"validation_accuracy": 0.91})
    TrainingJob.objects.filter(pk=second.pk).update(final_metrics={"validation_accuracy": 0.87})
    body = login(owner).get(reverse("job-compare") + f"?ids={first.pk},{second.pk}").content.decode()
    differing = rows_of(body, "differing-table")
    assert "learning_rate" in differing and "0.001" in differing and "0.01" in differing
    assert ">epochs<" not in differing and ">batch_size<" not in differing
    assert "more the same in all" in body
    final = rows_of(body, "final-table")
    assert "0.91" in final and "0.87" in final
    chart = json.loads(re.search(r'<script id="compare-data" type="application/json">(.*?)</script>', body, re.S).group(1))
    assert [j["id"] for j in chart["jobs"]] == [first.pk, second.pk]
    assert "validation_accuracy" in chart["metric_names"]


def test_compare_accepts_checkbox_ids_and_refuses_bad_counts(owner, project, version):
    jobs = [make_job(project, owner, version, name=f"j{i}") for i in range(11)]
    client = login(owner)
    repeated = client.get(reverse("job-compare") + f"?ids={jobs[0].pk}&ids={jobs[1].pk}")
    assert repeated.status_code == 200
    for query in (f"?ids={jobs[0].pk}", "?ids=" + ",".join(str(j.pk) for j in jobs), "?ids=1,x", ""):
        response = client.get(reverse("job-compare") + query)
        assert response.status_code == 302 and response["Location"] == reverse("job-list"), query
    follow = client.get(reverse("job-compare") + f"?ids={jobs[0].pk}", follow=True).content.decode()
    assert "Pick 2 to 10 jobs" in follow


# --- downloads -------------------------------------------------------------------------------
def test_model_download_streams_the_artifact(owner, viewer, project, version):
    job = make_job(project, owner, version, name="My Model!")
    client = login(viewer)
    assert client.get(reverse("job-model", args=[job.pk])).status_code == 404  # nothing yet
    uri = object_uri(f"jobs/{job.pk}/model.tar.gz")
    with store_for(uri).open_write(uri) as out:
        out.write(b"fake tarball bytes")
    TrainingJob.objects.filter(pk=job.pk).update(model_uri=uri, status=JobStatus.COMPLETED)
    response = client.get(reverse("job-model", args=[job.pk]))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"fake tarball bytes"
    assert f'filename="my-model-{job.pk}-model.tar.gz"' in response["Content-Disposition"]
    detail = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    assert f'href="{reverse("job-model", args=[job.pk])}"' in detail


def test_model_in_s3_redirects_to_a_presigned_link(owner, project, version, s3):
    job = make_job(project, owner, version)
    TrainingJob.objects.filter(pk=job.pk).update(model_uri=f"s3://models/jobs/{job.pk}/model.tar.gz")
    response = login(owner).get(reverse("job-model", args=[job.pk]))
    assert response.status_code == 302
    assert f"/models/jobs/{job.pk}/model.tar.gz" in response["Location"] and "Signature" in response["Location"]


def test_logs_download_joins_ranks_or_serves_one(owner, project, version):
    job = make_job(project, owner, version)
    for name, text in (("rank-0.log", "epoch 1 loss=0.5\n"), ("rank-1.log", "WORLD_SIZE=2\n")):
        uri = join_uri(job.output_uri, "logs", name)
        with store_for(uri).open_write(uri) as out:
            out.write(text.encode())
    client = login(owner)
    both = b"".join(client.get(reverse("job-logs", args=[job.pk])).streaming_content).decode()
    assert "==> rank-0.log <==\nepoch 1 loss=0.5" in both and "==> rank-1.log <==\nWORLD_SIZE=2" in both
    one = client.get(reverse("job-logs", args=[job.pk]) + "?rank=1")
    assert one["Content-Type"].startswith("text/plain")
    assert b"".join(one.streaming_content).decode() == "WORLD_SIZE=2\n"
    assert client.get(reverse("job-logs", args=[job.pk]) + "?rank=7").status_code == 404
