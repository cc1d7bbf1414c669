"""Imports what a job may import (trainyard, the built-in algorithms), then the studio's own
app code, which a job's sys.path does not reach: the job fails with that ImportError."""

import algorithms  # noqa: F401
import trainyard.metrics  # noqa: F401

print("import-app: trainyard and algorithms imported", flush=True)

import jobs.models  # noqa: E402, F401
