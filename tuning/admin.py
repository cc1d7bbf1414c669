from django.contrib import admin

from tuning.models import TuningJob


@admin.register(TuningJob)
class TuningJobAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "status", "strategy", "max_trials", "max_parallel", "best_value", "end_reason",
                    "created_at")
    list_filter = ("status", "strategy", "project")
    search_fields = ("name",)
    raw_id_fields = ("best_trial", "warm_start_from")
    readonly_fields = ("pruner_state",)
