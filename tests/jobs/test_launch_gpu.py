"""The launch of a GPU node's processes, without a GPU: the torchrun command line and the
launcher's environment (jobs.runner.process.launch) and the job's SageMaker variables
(jobs.runner.process.jobdir) for a node with GPUs, one node and several. The CPU forms and the
basic one-process-per-GPU case are in test_runner_units.py."""

from __future__ import annotations

import json
from dataclasses import replace

from jobs.runner.process.jobdir import JobDir, LaunchFacts, build_environment
from jobs.runner.process.launch import LaunchSpec, build_command, launch_environment

PY = "/venv/bin/python"
NCCL_VARIABLES = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def value_after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_a_gpu_node_runs_one_process_per_gpu_on_nccl_with_its_safety_variables(tmp_path):
    spec = LaunchSpec(job_id=3, attempt=1, python=PY, spool_dir=tmp_path, module="algorithms.charlm", gpus=4)

    command = build_command(spec)
    env = launch_environment(spec)

    assert spec.processes == 4
    assert value_after(command, "--nproc_per_node") == "4" and value_after(command, "--nnodes") == "1"
    assert "--standalone" in command and "--rdzv_backend" not in command
    assert env["TRAINYARD_DIST_BACKEND"] == "nccl"
    assert NCCL_VARIABLES.items() <= env.items()
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"  # ranks stay apart in the log


def test_an_explicit_process_count_on_a_gpu_node_still_uses_nccl(tmp_path):
    spec = LaunchSpec(job_id=3, attempt=1, python=PY, spool_dir=tmp_path, script="train.py", gpus=8, nproc_per_node=2)

    assert value_after(build_command(spec), "--nproc_per_node") == "2"
    assert launch_environment(spec)["TRAINYARD_DIST_BACKEND"] == "nccl"


def test_gpu_nodes_of_one_job_meet_at_node_0s_static_rendezvous(tmp_path):
    endpoint = "10.0.0.5:29400"
    specs = [LaunchSpec(job_id=9, attempt=3, python=PY, spool_dir=tmp_path, module="algorithms.charlm", gpus=4,
                        nnodes=2, node_rank=rank, rendezvous_endpoint=endpoint) for rank in (0, 1)]

    for rank, spec in enumerate(specs):
        command = build_command(spec)
        assert (value_after(command, "--nnodes"), value_after(command, "--nproc_per_node")) == ("2", "4")
        assert "--standalone" not in command
        # Static: node i hosts global ranks 4i..4i+3, so node 0 holds rank 0 (the one that writes the model).
        assert value_after(command, "--node_rank") == str(rank)
        assert value_after(command, "--rdzv_backend") == "static"
        assert value_after(command, "--rdzv_endpoint") == endpoint
        assert value_after(command, "--rdzv_id") == "job-9-3"
        assert value_after(command, "--max_restarts") == "0"
        assert command[-3:] == ["--module", "--", "algorithms.charlm"]
        assert launch_environment(spec)["TRAINYARD_DIST_BACKEND"] == "nccl"
    retry = LaunchSpec(job_id=9, attempt=4, python=PY, spool_dir=tmp_path, module="m", gpus=4, nnodes=2,
                       rendezvous_endpoint=endpoint)
    assert retry.rendezvous_id != specs[0].rendezvous_id  # a retry never joins the old attempt's rendezvous


def test_the_cpu_form_runs_one_process_on_gloo_without_nccl_variables(tmp_path):
    spec = LaunchSpec(job_id=3, attempt=1, python=PY, spool_dir=tmp_path, script="train.py", nnodes=2, node_rank=1,
                      rendezvous_endpoint="10.0.0.5:29400")

    env = launch_environment(spec)

    assert spec.processes == 1 and value_after(build_command(spec), "--nproc_per_node") == "1"
    assert env["TRAINYARD_DIST_BACKEND"] == "gloo"
    assert not set(NCCL_VARIABLES) & set(env)


def test_the_job_environment_counts_the_nodes_gpus_and_passes_the_workers_gpu_settings(tmp_path):
    job_dir = JobDir(tmp_path / "job")
    facts = LaunchFacts(job_id=5, job_name="lm", attempt=1, node_rank=0, hosts=["gpu-a", "gpu-b"], hyperparameters={},
                        channels={"train": "file"}, entry_point="algorithms.charlm", num_gpus=4, num_cpus=32,
                        redis_url="redis://r:6379/0")
    worker = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1",
              "DATABASE_URL": "postgres://secret"}

    env = build_environment(job_dir, facts, worker)

    assert (env["SM_NUM_GPUS"], env["SM_NUM_CPUS"]) == ("4", "32")
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert (training_env["num_gpus"], training_env["num_cpus"], training_env["is_master"]) == (4, 32, True)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_DISABLE"]) == ("eth0", "1")
    assert "DATABASE_URL" not in env
    cpu_only = build_environment(job_dir, replace(facts, num_gpus=0), worker)
    assert cpu_only["SM_NUM_GPUS"] == "0" and json.loads(cpu_only["SM_TRAINING_ENV"])["num_gpus"] == 0
