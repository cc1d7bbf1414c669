from django.contrib import admin

from datasets.models import Dataset, DatasetVersion


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "created_at"]
    list_filter = ["project"]
    search_fields = ["name"]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ["dataset", "version", "status", "format", "num_records", "size_bytes", "created_at"]
    list_filter = ["status", "format", "source_kind"]
    # Versions are immutable: the admin may look and delete, not edit.
    readonly_fields = [f.name for f in DatasetVersion._meta.fields]
