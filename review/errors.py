"""Why a review action refused: bad input or a state conflict, with the request field it
concerns and the HTTP status the API and pages answer with."""

from __future__ import annotations

from studio.errors import FieldError


class ReviewError(FieldError):
    """Bad input or a state conflict, with the request field it concerns."""


class LoopNameTaken(ReviewError):
    def __init__(self, name: str):
        super().__init__("name", f"A human loop named '{name}' already exists.", status=409)


class AssignmentConflict(ReviewError):
    """The assignment cannot take this answer/release any more (409)."""

    def __init__(self, message: str):
        super().__init__("assignment", message, status=409)
