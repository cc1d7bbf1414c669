"""The `navigation` context processor: the left navigation, the project switcher and the
signed-in user's situation, for every template that extends base.html."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest
from django.urls import reverse


@dataclass(frozen=True)
class NavItem:
    label: str
    url: str
    active: bool


# (label, route name, route-name prefixes that belong to the section)
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Overview", "overview", ("overview",)),
    ("Datasets", "dataset-list", ("dataset-",)),
    ("Jobs", "job-list", ("job-",)),
    ("Alarms", "alarms", ("alarms",)),
    ("Tuning", "tuning", ("tuning",)),
    ("Models", "models", ("model",)),
    ("Review", "review-inbox", ("review-",)),
    ("Nodes", "nodes", ("node",)),
)


def navigation(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Imported here: context processors load with the template engine, before the apps
    # whose models these helpers query may be ready.
    from studio.views import current_project, project_roles, reviewer_only

    match = getattr(request, "resolver_match", None)
    url_name = (match.url_name or "") if match else ""
    is_reviewer = reviewer_only(request)
    items = [
        NavItem(label, reverse(route), any(url_name.startswith(prefix) for prefix in prefixes))
        for label, route, prefixes in SECTIONS
        if not is_reviewer or route == "review-inbox"
    ]
    roles = project_roles(request)
    return {
        "nav_items": items,
        "nav_projects": roles,
        "nav_current_project": current_project(request),
        "nav_reviewer_only": is_reviewer,
    }
