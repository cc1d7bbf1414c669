"""The Alarms page: every rule in ALARM across the projects the viewer reads (the project
switcher narrows it), newest first, with what fired and when; `?state=` shows the rules in
another state (OK, INSUFFICIENT_DATA) and `?finished=true` (as the API; `?all=1` too) includes
finished jobs. A bad value is a 400 that says so above the list (shown for the defaults);
`?project=` naming no project the viewer reads is a 404, as the API's `?project=` is."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.models import FINISHED_STATUSES, AlarmTransition, JobRule, RuleState
from jobs.templatetags.job_rules import STATE_BADGES, action_words
from studio.models import Project
from studio.views import current_project, page

SHOWN = 200


@page
def alarms(request: HttpRequest) -> HttpResponse:
    errors: dict[str, str] = {}
    state = request.GET.get("state") or RuleState.ALARM
    if state not in RuleState.values:
        errors["state"] = (f"Unknown state {state[:50]!r}: use one of {', '.join(RuleState.values)}. "
                           "Shown below: the rules in ALARM.")
        state = RuleState.ALARM
    # ?finished=true as the API takes it (?all=1: the page's older links).
    finished = (request.GET.get("finished") or "").lower()
    if finished not in ("", "true", "false", "1", "0"):
        errors["finished"] = f"finished is true or false, not {finished[:50]!r}. Shown below: running jobs only."
    include_finished = finished in ("true", "1") or request.GET.get("all") == "1"
    project = current_project(request)
    # The switcher's choice is kept only for a project the viewer reads (studio.views): a
    # slug it dropped would otherwise list every project's alarms as if it were the one asked for.
    asked = request.GET.get("project", "")
    if asked and (project is None or project.slug != asked):
        raise Http404(f"No project {asked[:100]!r} among the projects you can read.")
    projects = Project.objects.readable_by(request.user)
    rules = JobRule.objects.filter(job__project__in=projects, state=state, enabled=True)
    if project is not None:
        rules = rules.filter(job__project=project)
    if not include_finished:
        rules = rules.exclude(job__status__in=FINISHED_STATUSES)
    rows = list(rules.select_related("job", "job__project").order_by("-state_changed_at", "-pk")[:SHOWN + 1])
    recent = (AlarmTransition.objects.filter(job__project__in=projects, to_state=RuleState.ALARM)
              .select_related("rule", "job", "job__project").order_by("-at", "-pk"))
    if project is not None:
        recent = recent.filter(job__project=project)
    return render(request, "jobs/alarms.html", {
        "rows": [{"rule": r, "badge": STATE_BADGES.get(r.state, "grey"), "actions": action_words(r.actions)}
                 for r in rows[:SHOWN]],
        "more": len(rows) > SHOWN,
        "recent": list(recent[:20]),
        "state": state,
        "states": RuleState.values,
        "include_finished": include_finished,
        "project": project,
        "errors": errors,
    }, status=400 if errors else 200)
