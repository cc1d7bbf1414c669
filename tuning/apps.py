from django.apps import AppConfig


class TuningConfig(AppConfig):
    name = "tuning"
    verbose_name = "Hyperparameter tuning"

    def ready(self) -> None:
        from jobs.transitions import job_finished
        from tuning.tasks import advance_when_trial_finished

        job_finished.connect(advance_when_trial_finished, dispatch_uid="tuning.advance_when_trial_finished")
