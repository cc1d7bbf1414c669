from django.apps import AppConfig


class HostingConfig(AppConfig):
    name = "hosting"

    def ready(self) -> None:
        from datasets.actions import register_version_uses
        from hosting.deletion import batch_prediction_uses, versions_from_jobs
        from jobs.deletion import register_job_keepers

        register_version_uses(batch_prediction_uses)
        register_job_keepers(versions_from_jobs)
