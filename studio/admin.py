from django.contrib import admin

from studio.models import ApiToken, Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    # The secret is never stored; the hash is not shown either (it identifies nothing useful).
    list_display = ["name", "user", "key_id", "created_at", "expires_at", "last_used_at"]
    list_filter = ["user"]
    fields = ["user", "name", "key_id", "created_at", "expires_at", "last_used_at"]
    readonly_fields = ["user", "name", "key_id", "created_at", "last_used_at"]

    def has_add_permission(self, request) -> bool:
        return False  # tokens are issued through the API or `studio token`, shown once
