"""A completed loop's output JSON, in Amazon A2I's shape plus our consolidation, written
to object_uri(f"review/{project}/flows/{flow}/loops/{name}/output.json")."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime

from datasets.storage import object_uri, store_for
from review.models import Assignment, AssignmentStatus, HumanLoop, TaskType


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def output_key(loop: HumanLoop) -> str:
    return f"review/{loop.flow_definition.project.slug}/flows/{loop.flow_definition_id}/loops/{loop.name}/output.json"


def loop_output(loop: HumanLoop) -> dict:
    answers = list(Assignment.objects.filter(loop=loop, status=AssignmentStatus.ANSWERED)
                   .select_related("worker").order_by("answered_at", "id"))
    consolidated = None
    if loop.flow_definition.task_type == TaskType.CLASSIFICATION:
        votes = Counter(a.answer.get("label") for a in answers if isinstance(a.answer, dict))
        consolidated = {"label": loop.consolidated_label or None, "agreement": loop.agreement,
                        "votes": dict(votes.most_common())}
    return {
        "humanLoopName": loop.name,
        "flowDefinition": loop.flow_definition.name,
        "inputContent": loop.input_content,
        "humanAnswers": [{
            "workerId": a.worker.username,
            "answerContent": a.answer,
            "submissionTime": _iso(a.answered_at),
            "timeSpentInSeconds": a.time_spent_seconds,
        } for a in answers],
        "consolidatedAnswer": consolidated,
        "modelPrediction": loop.prediction,
        "status": loop.status,
        "createdAt": _iso(loop.created_at),
        "completedAt": _iso(loop.completed_at),
    }


def write_loop_output(loop: HumanLoop) -> str:
    uri = object_uri(output_key(loop))
    body = json.dumps(loop_output(loop), indent=2, sort_keys=False).encode()
    with store_for(uri).open_write(uri) as out:
        out.write(body)
    return uri


def read_loop_output(loop: HumanLoop) -> dict:
    with store_for(loop.output_uri).open_read(loop.output_uri) as stream:
        return json.loads(stream.read())
