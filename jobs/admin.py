from django.contrib import admin

from jobs.models import Node, TrainingJob


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "hostname", "instance_type", "state", "cpus", "gpus", "last_heartbeat"]
    list_filter = ["instance_type", "state"]


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "status", "created_at"]
    list_filter = ["status", "project"]
