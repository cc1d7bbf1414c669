"""The node agent's parts that load no Django: they build, start, watch and judge a job's
processes, and the fork server (a process of its own) imports them alone.

    launch      the torch.distributed.run command line (pure; unit-tested)
    capture     the launcher's output: per-rank logs with caps, live lines, stdout metrics
    guard       memory / process-count limits, killing a process group, system metrics
    jobdir      the job directory (docs/SPEC.md §3.4) and the environment of the job's processes
    outcome     how a launch ended, in words a person can act on (failure_reason)
    forkserver  the warm pool's fork server: job processes forked from a warm interpreter

They import the standard library, psutil and `trainyard` only, never Django or an app.
"""
