from __future__ import annotations

from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "evaluations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from datasets.actions import register_version_uses
        from evaluations.deletion import evaluation_uses, forget_artifacts

        register_version_uses(evaluation_uses)
        from django.db.models.signals import post_delete

        from evaluations.models import Evaluation

        # An evaluation goes with its model version (a cascade): its artifacts go too,
        # whichever delete took it.
        post_delete.connect(forget_artifacts, sender=Evaluation, dispatch_uid="evaluation-artifacts")
