"""The jobs that trained on a dataset, as a fragment the dataset page loads (htmx): datasets
sit below jobs and never import them, so the jobs app answers for its own rows."""

from __future__ import annotations

from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from datasets.models import Dataset
from jobs.models import JobInput, TrainingJob
from studio.access import check_role
from studio.views import page

DATASET_JOBS_SHOWN = 50


@page
def dataset_jobs(request: HttpRequest, pk: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset.objects.select_related("project"), pk=pk)
    check_role(request.user, dataset.project)  # 404 for an outsider, as the dataset page
    inputs = JobInput.objects.filter(dataset_version__dataset=dataset).select_related("dataset_version").order_by("channel")
    jobs = list(TrainingJob.objects.filter(project=dataset.project, inputs__dataset_version__dataset=dataset)
                .distinct().order_by("-created_at").only("id", "name", "status", "created_at", "final_metrics")
                .prefetch_related(Prefetch("inputs", queryset=inputs, to_attr="dataset_inputs"))[:DATASET_JOBS_SHOWN + 1])
    return render(request, "jobs/_dataset_jobs.html", {
        "dataset": dataset, "jobs": jobs[:DATASET_JOBS_SHOWN], "more": len(jobs) > DATASET_JOBS_SHOWN})
