"""The Trainyard SDK: the small library that runs inside training processes (metrics,
checkpoint helpers, environment parsing) and a thin REST client. It never imports Django.

Its contents arrive with the training-jobs work; SPEC.md §3–4 define the contracts."""

__version__ = "0.1.0"
