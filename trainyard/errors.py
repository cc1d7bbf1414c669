"""The one error a training process turns into its job's reason."""

from __future__ import annotations


class DataError(Exception):
    """Input a person must fix (a missing column, an empty channel, a bad hyperparameter, a
    pipeline that cannot be cut to fit); a training process writes its message to
    $SM_OUTPUT_DIR/failure, verbatim."""
