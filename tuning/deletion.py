"""Deleting a tuning job (studio.deletion has the shared machinery).

Rules:
- a search in progress (InProgress, Stopping) or with a trial still running is refused:
  stop it first;
- a search one of whose trials a registered model version came from is archived with
  all its trials (the model's history is the search that found it);
- otherwise the search goes with its trials, their metrics and their stored outputs.
"""

from __future__ import annotations

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from jobs.deletion import erase_jobs, job_outputs
from jobs.models import MetricPoint, TrainingJob
from studio.deletion import Blocker, DeletionBlocked, DeletionPlan, plural
from tuning.models import TuningJob


def tuning_deletion_plan(tuning: TuningJob) -> DeletionPlan:
    from hosting.models import ModelVersion

    plan = DeletionPlan(what=f"tuning job {tuning.pk} '{tuning.name}'")
    url = reverse("tuning-detail", args=[tuning.pk])
    trials = list(TrainingJob.objects.filter(tuning_job=tuning).order_by("trial_number"))
    running = [t for t in trials if not t.is_finished()]
    if not tuning.is_finished() or running:
        state = tuning.status if not tuning.is_finished() else f"{tuning.status}, {plural(len(running), 'trial')} still running"
        plan.blockers.append(Blocker(f"Tuning job '{tuning.name}' is {state}: stop it first, then delete it.",
                                     name=tuning.name, url=url))
    versions = list(ModelVersion.objects.filter(job__in=trials).select_related("model", "job"))
    if versions:
        plan.archive = True
        names = ", ".join(f"{v.model.name} v{v.version} (trial {v.job.trial_number})" for v in versions if v.job)
        plan.archive_reason = (f"Model {names} came from this search, so it is archived with its trials instead: it "
                               "leaves the lists, and its trials' artifacts and metrics stay.")
        plan.archive_links = [Blocker(f"{v.model.name} v{v.version}", name=v.model.name,
                                      url=reverse("model-detail", args=[v.model_id])) for v in versions]
        return plan
    totals = {"artifacts": 0, "logs": 0, "checkpoints": 0}
    for trial in trials:
        counts, uris = job_outputs(trial)
        plan.uris.extend(uris)
        for name in totals:
            totals[name] += counts[name]
    plan.goes = [
        plural(len(trials), "trial"),
        plural(totals["artifacts"], "artifact"),
        plural(totals["checkpoints"], "checkpoint file"),
        plural(totals["logs"], "log file"),
        plural(MetricPoint.objects.filter(job__in=trials).count(), "metric point"),
    ]
    return plan


def delete_tuning_job(tuning: TuningJob) -> tuple[str, TuningJob | None]:
    """Delete or archive a search and its trials: ("deleted", None) or ("archived", it)."""
    with transaction.atomic():
        tuning = TuningJob.objects.select_for_update().get(pk=tuning.pk)
        # Lock the trials too: a trial cannot start between the check and the delete.
        list(TrainingJob.objects.select_for_update().filter(tuning_job=tuning).values_list("pk", flat=True))
        plan = tuning_deletion_plan(tuning)
        if plan.blocked:
            raise DeletionBlocked(plan)
        if plan.archive:
            now = timezone.now()
            if tuning.archived_at is None:
                tuning.archived_at = now
                TuningJob.objects.filter(pk=tuning.pk).update(archived_at=now)
            TrainingJob.objects.filter(tuning_job=tuning, archived_at__isnull=True).update(archived_at=now)
            return "archived", tuning
        erase_jobs(list(TrainingJob.objects.filter(tuning_job=tuning)), plan.uris, plan.what)
        TuningJob.objects.filter(pk=tuning.pk).delete()
    return "deleted", None
