from django.contrib import admin

from review.models import Assignment, FlowDefinition, HumanLoop, WorkTeam


@admin.register(WorkTeam)
class WorkTeamAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "created_at")
    list_filter = ("project",)
    search_fields = ("name",)
    filter_horizontal = ("members",)


@admin.register(FlowDefinition)
class FlowDefinitionAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "work_team", "task_type", "task_count", "order", "created_at")
    list_filter = ("task_type", "project")
    search_fields = ("name", "title")
    readonly_fields = ("instructions_html",)


@admin.register(HumanLoop)
class HumanLoopAdmin(admin.ModelAdmin):
    # Slot counters are read-only here: they change only under the loop's lock (review.actions).
    list_display = ("name", "flow_definition", "status", "answers_count", "answers_needed", "holds_count", "open_slots",
                    "consolidated_label", "created_at")
    list_filter = ("status", "project")
    search_fields = ("name",)
    raw_id_fields = ("flow_definition", "model_version", "created_by")
    readonly_fields = ("answers_needed", "answers_count", "holds_count", "open_slots", "escalations",
                       "consolidated_label", "agreement", "output_uri")


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ("id", "loop", "worker", "status", "claimed_at", "lease_expires_at", "answered_at")
    list_filter = ("status",)
    raw_id_fields = ("loop", "worker")
    readonly_fields = ("status", "answer", "claimed_at", "lease_expires_at", "answered_at", "ended_at")
