"""Deleting models, model versions and endpoints (studio.deletion has the machinery).

Rules:
- a model version an endpoint serves is refused, naming the endpoint: delete it or switch
  it to another version first (a model is refused while any of its versions is served);
- a batch prediction still running over a version refuses it; finished ones go with it,
  their predictions.jsonl too;
- the version's model.tar.gz is its job's output: it goes only when the job itself is
  gone (a job a model came from is archived, not deleted, so the artifact normally stays
  with the job);
- an endpoint can always be deleted; the review items it started stay in their flow.
"""

from __future__ import annotations

from django.db import transaction
from django.urls import reverse

from datasets.actions import VersionUse
from datasets.models import DatasetVersion
from hosting.models import BatchPrediction, BatchStatus, Endpoint, Model, ModelVersion
from jobs.deletion import KeptBy
from studio.deletion import Blocker, DeletionBlocked, DeletionPlan, plural, record_objects


def endpoint_url(endpoint: Endpoint) -> str:
    return reverse("endpoint-detail", args=[endpoint.name])


def versions_from_jobs(job_ids: list[int]) -> list[KeptBy]:
    """The model versions made from these jobs, which keep them; registered with
    jobs.deletion by HostingConfig.ready()."""
    return [KeptBy(job_id=job_id, model=model, version=number, url=reverse("model-detail", args=[model_id]))
            for job_id, model_id, model, number in ModelVersion.objects.filter(job_id__in=job_ids)
            .order_by("model__name", "version").values_list("job_id", "model_id", "model__name", "version")]


def batch_prediction_uses(version: DatasetVersion) -> list[VersionUse]:
    """The batch predictions that read a dataset version (first five); registered with
    datasets.actions by HostingConfig.ready()."""
    return [VersionUse("batch prediction", f"{pk} (model {model} v{number})", reverse("model-detail", args=[model_id]))
            for pk, model_id, model, number in BatchPrediction.objects.filter(dataset_version=version).order_by("pk")
            .values_list("pk", "model_version__model_id", "model_version__model__name", "model_version__version")[:5]]


def _version_blockers(versions: list[ModelVersion]) -> list[Blocker]:
    blockers = []
    served = Endpoint.objects.filter(model_version__in=versions).select_related("model_version__model").order_by("name")
    for endpoint in served:
        version = endpoint.model_version
        blockers.append(Blocker(
            f"{version.model.name} v{version.version} is served by endpoint '{endpoint.name}': delete that endpoint "
            "or switch it to another version first.", name=endpoint.name, url=endpoint_url(endpoint)))
    running = BatchPrediction.objects.filter(model_version__in=versions, status__in=[BatchStatus.PENDING, BatchStatus.RUNNING])
    for batch in running.select_related("model_version__model"):
        blockers.append(Blocker(
            f"Batch prediction {batch.pk} over {batch.model_version.model.name} v{batch.model_version.version} is "
            f"{batch.status}: wait for it to finish.", name=f"batch prediction {batch.pk}",
            url=reverse("model-detail", args=[batch.model_version.model_id])))
    return blockers


def _version_uris(versions: list[ModelVersion]) -> list[str]:
    uris = [b for b in BatchPrediction.objects.filter(model_version__in=versions).values_list("output_uri", flat=True) if b]
    uris += [v.artifact_uri for v in versions if v.job_id is None and v.artifact_uri]
    return uris


def _version_goes(versions: list[ModelVersion]) -> list[str]:
    batches = BatchPrediction.objects.filter(model_version__in=versions)
    kept = [v for v in versions if v.job_id is not None]
    lines = [plural(batches.count(), "batch prediction") + " and their predictions.jsonl",
             plural(len(versions) - len(kept), "model tarball")]
    if kept:
        lines.append(f"{plural(len(kept), 'model tarball')} stay with the job they came from")
    return lines


def version_deletion_plan(version: ModelVersion) -> DeletionPlan:
    plan = DeletionPlan(what=f"model version {version.model.name} v{version.version}")
    plan.blockers = _version_blockers([version])
    plan.goes = _version_goes([version])
    plan.uris = _version_uris([version])
    return plan


def model_deletion_plan(model: Model) -> DeletionPlan:
    versions = list(model.versions.all())
    plan = DeletionPlan(what=f"model {model.pk} '{model.name}'")
    plan.blockers = _version_blockers(versions)
    plan.goes = [plural(len(versions), "version"), *_version_goes(versions)]
    plan.uris = _version_uris(versions)
    return plan


def delete_model_version(version: ModelVersion) -> None:
    with transaction.atomic():
        Model.objects.select_for_update().filter(pk=version.model_id).first()
        version = ModelVersion.objects.select_related("model").get(pk=version.pk)
        plan = version_deletion_plan(version)
        if plan.blocked:
            raise DeletionBlocked(plan)
        BatchPrediction.objects.filter(model_version=version).delete()
        version.delete()
        record_objects(plan.what, plan.uris)


def delete_model(model: Model) -> None:
    with transaction.atomic():
        model = Model.objects.select_for_update().get(pk=model.pk)
        plan = model_deletion_plan(model)
        if plan.blocked:
            raise DeletionBlocked(plan)
        BatchPrediction.objects.filter(model_version__model=model).delete()
        ModelVersion.objects.filter(model=model).delete()
        model.delete()
        record_objects(plan.what, plan.uris)


def endpoint_deletion_plan(endpoint: Endpoint) -> DeletionPlan:
    plan = DeletionPlan(what=f"endpoint '{endpoint.name}'")
    plan.goes = [f"its URL /api/v1/endpoints/{endpoint.name}/invocations stops answering",
                 plural(endpoint.invocations, "counted invocation")]
    if endpoint.flow_definition_id:
        plan.goes.append("review items it already sent stay in their flow")
    return plan
