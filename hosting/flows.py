"""The flow definitions endpoints and batches send their predictions to, as hosting sees
them, without importing the app that owns them (review builds on hosting, not the
reverse).

An Endpoint or a BatchPrediction names its flow through a foreign key; this module reaches
the flow's model through that key, and hands predictions on by sending the
`predictions_made` signal, which the owning app connects at start-up (AppConfig.ready).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.dispatch import Signal

from hosting.models import Endpoint

# Sent with the predictions an endpoint or a batch made for a flow definition, in the
# caller's transaction (a batch's: the one that records its chunk). Keyword arguments:
# flow (the flow definition), items ([(input_content, prediction)]), source (a dict saying
# where they came from), model_version, first_record (a batch's index of items[0]).
# Each receiver returns the names of the human loops it started.
predictions_made = Signal()


def flow_model() -> type[models.Model]:
    """The flow definition model, as Endpoint.flow_definition points to it."""
    model = Endpoint._meta.get_field("flow_definition").related_model
    assert isinstance(model, type) and issubclass(model, models.Model)
    return model


def flows_of_project(project_id: int) -> models.QuerySet:
    """The project's flow definitions by name: the choices of the deploy, batch and
    endpoint settings forms."""
    return flow_model()._default_manager.filter(project_id=project_id).order_by("name")


def send_predictions(sender: type[models.Model], flow: Any, items: Sequence[tuple[Any, dict]], *, source: dict,
                     model_version: Any, first_record: int = 0) -> list[str]:
    """Hand predictions made for `flow` to the receivers of predictions_made; the names
    of the human loops they started ([] without a flow or a receiver)."""
    if flow is None or not items:
        return []
    responses = predictions_made.send(sender, flow=flow, items=items, source=source, model_version=model_version,
                                      first_record=first_record)
    # django-stubs types a receiver's answer as str | None; it is what the receiver returns (loop names).
    return [name for _receiver, names in responses for name in names]  # type: ignore[union-attr]
