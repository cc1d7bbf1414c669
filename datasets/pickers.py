"""The dataset versions that job, tuning and model forms offer in their channel pickers."""

from __future__ import annotations

from collections.abc import Iterable

from datasets.models import DatasetVersion, VersionStatus
from studio.models import Project


def ready_versions(projects: Iterable[Project]) -> list[dict]:
    """Every ready version of these projects (by dataset, newest first) for the channel pickers,
    with the facts the form checks each algorithm against (algorithms.base.data_problem)."""
    from algorithms.base import DataFacts

    versions = list(DatasetVersion.objects.filter(dataset__project__in=list(projects), status=VersionStatus.READY)
                    .select_related("dataset__project")
                    .only("id", "version", "num_records", "format", "created_at", "dataset__id", "dataset__name",
                          "dataset__project__slug", "schema", "text_column", "requested_options")
                    .order_by("dataset__name", "-version"))
    # A detected format matches the file extensions by construction; only a version whose
    # format was chosen (or is not known to have been detected) needs its file list read.
    forced = [v.pk for v in versions if (v.requested_options or {}).get("format") or not v.requested_options]
    files = dict(DatasetVersion.objects.filter(pk__in=forced).values_list("pk", "files")) if forced else {}
    return [{"id": v.pk, "project": v.dataset.project.slug, "dataset": v.dataset.name, "dataset_id": v.dataset.pk,
             "version": v.version, "records": v.num_records, "format": v.format, "text_column": v.text_column,
             "facts": DataFacts.of(v, files=files.get(v.pk, [])).as_json()} for v in versions]
