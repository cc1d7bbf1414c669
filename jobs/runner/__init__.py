"""The node agent: what a node worker does with one job launch.

    agent.run_node(job_id, attempt, node_rank)   claim → stage → launch → watch → finish

The pieces, one module per responsibility:
    config    the agent's settings (grace periods, caps, intervals), read once per run
    lease     the job's lease and the node's heartbeat, renewed while the job runs
    jobdir    the job directory of SPEC §3 and the environment of the job's processes
    staging   dataset channels (content-hash cache, seeded splits, stream manifests)
    artifacts script code, checkpoints (restore + sync), model.tar.gz, log uploads
    launch    the torch.distributed.run command line (pure; unit-tested)
    capture   the launcher's output: per-rank logs with caps, live lines, stdout metrics
    guard     memory / process-count limits, killing a process group, system metrics
    outcome   how a launch ended, in words a person can act on (failure_reason)
"""
