"""Evaluations in other objects' deletes: a dataset version an evaluation read is kept
(the report cites it; datasets.actions asks every app that reads versions), and an
evaluation's artifacts go when its row goes, by whatever delete (its own, or its model
version's cascade)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from datasets.actions import VersionUse
from datasets.models import DatasetVersion
from evaluations.models import Evaluation
from studio.deletion import record_objects


def evaluation_uses(version: DatasetVersion) -> list[VersionUse]:
    """The evaluations that read a dataset version (first five); registered with
    datasets.actions by EvaluationsConfig.ready()."""
    return [VersionUse("evaluation", f"{pk} (model {model} v{number})", reverse("evaluation-detail", args=[pk]))
            for pk, model, number in Evaluation.objects.filter(dataset_version=version).order_by("pk")
            .values_list("pk", "model_version__model__name", "model_version__version")[:5]]


def forget_artifacts(sender: Any, instance: Evaluation, **_signal: Any) -> None:
    """post_delete: the scores and CSV are removed in the background (studio.deletion
    records them first, so an interrupted removal is swept later)."""
    uris = [uri for uri in (instance.artifacts or {}).values() if isinstance(uri, str) and uri]
    if uris:
        record_objects(f"evaluation {instance.pk}", uris)


def delete_evaluation(evaluation: Evaluation) -> None:
    """An evaluation can always be deleted; a flow whose threshold came from it keeps its
    threshold and its record (which names the evaluation's number)."""
    evaluation.delete()
