"""The node agent: what a node worker does with one job launch.

    agent.run_node(job_id, attempt, node_rank)   claim → stage → launch → watch → finish

The pieces, one module per responsibility:
    config    the agent's settings (grace periods, caps, intervals), read once per run
    lease     the job's lease and the node's heartbeat, renewed while the job runs
    staging   dataset channels (content-hash cache, seeded splits, stream manifests)
    artifacts script code, checkpoints (restore + sync), model.tar.gz, log uploads
    warm      the warm pool's fork server, held by the node while warm
    process/  what loads no Django: the job directory and environment, the launch
              command, output capture, the guard, the outcome and the fork server
"""
