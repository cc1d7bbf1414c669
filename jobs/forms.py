"""The job form's fixed fields. Like the dataset upload form, it only renders: the browser
sends the values as JSON to POST /api/v1/jobs/ (static/js/job_form.js) and the API's
serializer and jobs.actions validate them, so page and API never disagree. The fields
that depend on the algorithm (hyperparameters, channels) are generated in the browser
from the algorithm's schema."""

from __future__ import annotations

from typing import Any

from django import forms

from jobs.actions import tags_for_clone
from jobs.serializers import AVAILABLE_DISTRIBUTIONS, MAX_RUNTIME_LIMIT, PIPELINE_SCHEDULES
from studio.models import Project

MONO = {"class": "mono", "spellcheck": "false", "autocomplete": "off"}
ENV_PLACEHOLDER = "TOKENIZERS_PARALLELISM=false\nMY_FLAG=1"
DISTRIBUTION_LABELS = {"none": "None (one process)", "ddp": "Data parallel (DDP)", "fsdp": "Sharded data parallel (FSDP)",
                       "pipeline": "Pipeline model parallel"}
# Shown under the choice (static/js/job_form.js swaps them as the choice changes).
DISTRIBUTION_HELP = {
    "none": "One process per node; no torch.distributed.",
    "ddp": "Every process holds the whole model and trains on its share of each batch; gradients are averaged.",
    "fsdp": "Parameters, gradients and optimizer state are sharded over the processes: for models too big for one.",
    "pipeline": "The model's layers are cut into stages, one process each; every batch flows through them in microbatches.",
}
PARTITION_CHOICES = [("auto", "Auto (balance by each layer's cost)"), ("even", "Even (same number of layers per stage)"),
                     ("manual", "Manual (layer counts per stage)")]
SCHEDULE_LABELS = {"gpipe": "GPipe", "1f1b": "1F1B"}
SCHEDULE_HELP = ("GPipe runs every microbatch forward, then every one backward; 1F1B alternates them and holds fewer "
                 "activations at once.")


class JobForm(forms.Form):
    project = forms.ChoiceField(help_text="Projects where you are a scientist or an admin.")
    name = forms.CharField(max_length=200, help_text="Need not be unique; the job's number identifies it.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}))
    algorithm = forms.ChoiceField(required=False)
    entry_point = forms.CharField(required=False, max_length=255, help_text="The .py file to run, inside the upload.",
                                  widget=forms.TextInput(attrs={**MONO, "placeholder": "train.py"}))
    instance_type = forms.ChoiceField(label="Instance type", help_text="The node queue the job runs on.")
    instance_count = forms.IntegerField(label="Nodes", min_value=1, max_value=256, initial=1)
    processes_per_node = forms.IntegerField(label="Processes per node", min_value=1, max_value=256, required=False,
                                            help_text="Empty: one per GPU, or one on CPU nodes.")
    distribution = forms.ChoiceField(choices=[(str(d), DISTRIBUTION_LABELS.get(str(d), str(d))) for d in AVAILABLE_DISTRIBUTIONS])
    max_runtime_seconds = forms.IntegerField(label="Max runtime (seconds)", min_value=1, max_value=MAX_RUNTIME_LIMIT,
                                             required=False, help_text="Stopped with MaxRuntimeExceeded after this long.",
                                             widget=forms.NumberInput(attrs={"placeholder": "no limit"}))
    checkpoint_every_steps = forms.IntegerField(label="Checkpoint every (steps)", min_value=0, required=False,
                                                help_text="0 or empty: no periodic checkpoints.")
    checkpoint_uri = forms.CharField(label="Checkpoint URI", required=False, max_length=1024,
                                     help_text="Reuse a URI to resume from its newest checkpoint.",
                                     widget=forms.TextInput(attrs={**MONO, "placeholder": "s3://bucket/checkpoints/run-1/"}))
    tags = forms.CharField(required=False, help_text="Comma-separated, e.g. baseline, small.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "placeholder": "baseline, small"}))
    environment = forms.CharField(required=False, help_text="One KEY=value per line; SM_* and torch variables are set for you.",
                                  widget=forms.Textarea(attrs={**MONO, "rows": 3, "placeholder": ENV_PLACEHOLDER}))
    retries = forms.IntegerField(min_value=0, max_value=10, initial=0, help_text="Relaunches after a node is lost.")
    keep_alive_seconds = forms.IntegerField(label="Keep warm (seconds)", min_value=0, max_value=3600, initial=0,
                                            help_text="Keep the node's process warm for the next job.")
    priority = forms.IntegerField(min_value=-100, max_value=100, initial=0,
                                  help_text="-100 to 100; higher starts first, first come first served within a priority.")
    # distribution "pipeline": posted as the API's `pipeline` object.
    pipeline_stages = forms.IntegerField(label="Stages", min_value=2, max_value=64, initial=2,
                                         help_text="One process per stage.")
    pipeline_microbatches = forms.IntegerField(label="Microbatches", min_value=1, max_value=1024, initial=4,
                                               help_text="Each batch is split into this many; at most the batch size.")
    pipeline_schedule = forms.ChoiceField(label="Schedule", choices=[(s, SCHEDULE_LABELS.get(s, s)) for s in PIPELINE_SCHEDULES],
                                          help_text=SCHEDULE_HELP)
    pipeline_partition = forms.ChoiceField(label="Partition", choices=PARTITION_CHOICES)
    pipeline_partition_counts = forms.CharField(label="Layers per stage", required=False, max_length=400,
                                                widget=forms.TextInput(attrs={**MONO, "placeholder": "3, 2"}))
    pipeline_memory_cap_mb = forms.IntegerField(label="Memory cap per stage (MB)", min_value=1, required=False,
                                                help_text="Auto partitioning keeps each stage under it.",
                                                widget=forms.NumberInput(attrs={"placeholder": "no cap"}))

    def __init__(self, *args: Any, projects: list[Project], algorithms: dict, instance_types: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        project, algorithm, instance_type = self.fields["project"], self.fields["algorithm"], self.fields["instance_type"]
        assert isinstance(project, forms.ChoiceField) and isinstance(algorithm, forms.ChoiceField)
        assert isinstance(instance_type, forms.ChoiceField)
        project.choices = [(p.slug, f"{p.name} ({p.slug})" if p.name != p.slug else p.slug) for p in projects]
        # In the registry's order (the simplest first), not alphabetical.
        algorithm.choices = [(name, f"{spec.title} ({name})") for name, spec in algorithms.items()]
        wanted = self.initial.get("instance_type")
        types = list(instance_types) + ([wanted] if wanted and wanted not in instance_types else [])
        instance_type.choices = [(t, t) for t in types]


def clone_initial(submission: dict[str, Any], writable_slugs: list[str]) -> dict[str, Any]:
    """The fixed fields of a clone, from the source job's submission (as_submission). The
    project stays the same when the user may write there; otherwise the first project they
    can write to (inputs then need picking again). The name gains "-clone" and a tuning
    trial's `tuning:<id>` tag is not carried."""
    resources, stopping, checkpoint = submission["resources"], submission["stopping"], submission["checkpoint"] or {}
    return {
        "project": submission["project"] if submission["project"] in writable_slugs else writable_slugs[0],
        "name": f"{submission['name']}-clone"[:200],
        "algorithm": submission["algorithm"],
        "entry_point": (submission["script"] or {}).get("entry_point", ""),
        "instance_type": resources.get("instance_type", "cpu"),
        "instance_count": int(resources.get("instance_count", 1)),
        "processes_per_node": resources.get("processes_per_node"),
        "distribution": submission["distribution"],
        "max_runtime_seconds": int(stopping["max_runtime_seconds"]) if stopping.get("max_runtime_seconds") else None,
        "checkpoint_every_steps": checkpoint.get("every_steps") or None,
        "checkpoint_uri": checkpoint.get("uri", ""),
        "tags": ", ".join(tags_for_clone(submission["tags"])),
        "environment": "\n".join(f"{key}={value}" for key, value in sorted(submission["environment"].items())),
        "retries": submission["retries"],
        "keep_alive_seconds": submission["keep_alive_seconds"],
        "priority": submission["priority"],
        **pipeline_initial(submission["pipeline"] or {}),
    }


def pipeline_initial(pipeline: dict[str, Any]) -> dict[str, Any]:
    """The pipeline fields of a clone; a partition list becomes "manual" with its counts."""
    if not pipeline:
        return {}
    partition = pipeline.get("partition", "auto")
    manual = isinstance(partition, list)
    return {
        "pipeline_stages": pipeline.get("stages"),
        "pipeline_microbatches": pipeline.get("microbatches"),
        "pipeline_schedule": pipeline.get("schedule") or "gpipe",
        "pipeline_partition": "manual" if manual else str(partition),
        "pipeline_partition_counts": ", ".join(str(count) for count in partition) if manual else "",
        "pipeline_memory_cap_mb": pipeline.get("memory_cap_mb"),
    }
