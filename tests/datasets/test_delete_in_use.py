"""Deleting a dataset (version) that something reads: the refusal names
what reads it and links to it; a version used only by a batch prediction is refused like
one a job uses (it was an uncaught ProtectedError, a 500); and delete_dataset checks use
inside the transaction that deletes, so it is all or nothing even when a job starts
reading a version while the delete runs."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.urls import reverse

from datasets import actions
from datasets.models import Dataset, DatasetVersion
from hosting.models import BatchPrediction, BatchStatus, Model, ModelVersion
from jobs.models import JobInput, JobStatus, TrainingJob
from tests.datasets.test_pages import GOOD_CSV, login, make_version


def _batch_over(project, version) -> BatchPrediction:
    job = TrainingJob.objects.create(project=project, name="source", status=JobStatus.COMPLETED)
    model = Model.objects.create(project=project, name="scorer")
    model_version = ModelVersion.objects.create(model=model, version=1, job=job, artifact_uri="file:///x", kind="tabular")
    return BatchPrediction.objects.create(project=project, model_version=model_version, dataset_version=version,
                                          status=BatchStatus.COMPLETED)


def test_refusal_names_the_job_and_links_to_it(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    job = TrainingJob.objects.create(project=project, name="resnet-<b>big</b>", created_by=teammate)
    JobInput.objects.create(job=job, channel="train", dataset_version=version)

    page = login(teammate).post(reverse("dataset-version-delete", args=[version.pk]), follow=True).content.decode()

    link = f'<a href="{reverse("job-detail", args=[job.pk])}">resnet-&lt;b&gt;big&lt;/b&gt;</a>'
    assert link in page
    assert "Delete that job first" in page
    assert DatasetVersion.objects.filter(pk=version.pk).exists()


def test_version_used_only_by_a_batch_prediction_is_refused_on_the_page(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    batch = _batch_over(project, version)

    response = login(teammate).post(reverse("dataset-version-delete", args=[version.pk]), follow=True)

    assert response.status_code == 200
    page = response.content.decode()
    assert f"a batch prediction (<a href=\"{reverse('model-detail', args=[batch.model_version.model_id])}\">" in page
    assert "Delete that batch prediction first" in page
    assert DatasetVersion.objects.filter(pk=version.pk).exists()


def test_delete_dataset_is_all_or_nothing_when_a_later_version_is_in_use(owner, project, tmp_path):
    first = make_version(project, owner, tmp_path)
    second = make_version(project, owner, tmp_path, files={"train.csv": GOOD_CSV + b"4,5.5,dog\n"})
    assert second.dataset_id == first.dataset_id and second.version == 2
    _batch_over(project, second)

    with pytest.raises(actions.VersionInUse) as refused:
        actions.delete_dataset(first.dataset)

    assert "batch prediction" in str(refused.value)
    assert DatasetVersion.objects.filter(pk__in=[first.pk, second.pk]).count() == 2


@pytest.mark.django_db(transaction=True)
def test_delete_dataset_checks_use_inside_its_transaction(owner, project, tmp_path):
    """A job starts reading the version while delete_dataset waits for the dataset's lock:
    the delete must see it (refused, nothing deleted), not check before and fail after."""
    version = make_version(project, owner, tmp_path)
    job = TrainingJob.objects.create(project=project, name="late-reader", created_by=owner)
    outcome: dict[str, object] = {}
    locked = threading.Event()

    def reader() -> None:
        try:
            with transaction.atomic():
                Dataset.objects.select_for_update().get(pk=version.dataset_id)
                locked.set()
                time.sleep(1.0)  # the deleter is waiting now, its own checks (if any) done outside
                JobInput.objects.create(job=job, channel="train", dataset_version=version)
        finally:
            connection.close()

    def deleter() -> None:
        locked.wait(10)
        try:
            actions.delete_dataset(Dataset.objects.get(pk=version.dataset_id))
            outcome["result"] = "deleted"
        except Exception as exc:  # noqa: BLE001 - which exception is what the test checks
            outcome["result"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=reader), threading.Thread(target=deleter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert isinstance(outcome["result"], actions.VersionInUse), outcome
    assert "late-reader" in str(outcome["result"])
    assert DatasetVersion.objects.filter(pk=version.pk).exists()
    assert Dataset.objects.filter(pk=version.dataset_id).exists()
