"""A completed loop's output JSON, in Amazon A2I's shape plus our consolidation, written
to object_uri(f"review/{project}/flows/{flow}/loops/{name}/output.json") by the control
worker after the answer that completed the loop commits, or by the beat if that failed."""

from __future__ import annotations

import json
import logging
from collections import Counter
from datetime import datetime

from datasets.storage import object_uri, store_for
from review.models import HumanLoop, TaskType

log = logging.getLogger(__name__)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def output_key(loop: HumanLoop) -> str:
    return f"review/{loop.flow_definition.project.slug}/flows/{loop.flow_definition_id}/loops/{loop.name}/output.json"


def loop_output(loop: HumanLoop) -> dict:
    answers = list(loop.assignments.answered()
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


def write_output(loop_id: int, loop: HumanLoop | None = None) -> str:
    """Write the loop's A2I-shaped output JSON and record its URI. `loop`: the instance
    just completed (with its flow and project), which saves reading it again."""
    if loop is None:
        loop = HumanLoop.objects.select_related("flow_definition", "flow_definition__project").get(pk=loop_id)
    uri = write_loop_output(loop)
    HumanLoop.objects.filter(pk=loop_id).update(output_uri=uri)
    loop.output_uri = uri
    return uri


def write_output_soon(loop_id: int) -> None:
    """Hand the output JSON to the control worker: an object-store write (a PUT to S3)
    does not belong in a reviewer's answer request. If the broker is unreachable the
    answer still stands; expire_review_work writes the output on a later tick."""
    from review.tasks import write_output_task  # review.tasks imports this module

    try:
        write_output_task.delay(loop_id)
    except Exception:
        log.warning("could not enqueue the output of human loop %s; beat will write it", loop_id, exc_info=True)


def write_output_safely(loop_id: int, loop: HumanLoop | None = None) -> str | None:
    """write_output, logging instead of raising: the answers are in the database and
    expire_review_work retries."""
    try:
        return write_output(loop_id, loop)
    except Exception:
        log.warning("could not write the output of human loop %s; will retry", loop_id, exc_info=True)
        return None
