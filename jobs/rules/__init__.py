"""Rules on a job's live metric stream (docs/SPEC.md §10): built-ins such as `non_finite`
and custom "M of N" alarms, evaluated as points arrive by the rule watcher beside the
flusher, with actions (stop, notify, tag).

- engine.py: the rules themselves, Django-free: checking a rule's spec and evaluating it
  on points, GPU samples and the clock, returning state transitions.
- watcher.py: the consumer of the jobs' metric, log and system streams (its own consumer
  group beside the flusher's) that feeds the engine and stores transitions.
- actions.py: what a transition does (stop the job, notify the project's channels, tag).
"""
