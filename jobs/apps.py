from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        from datasets.actions import register_version_uses
        from jobs.deletion import training_job_uses

        register_version_uses(training_job_uses)
