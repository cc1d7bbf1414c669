"""A job's `distribution` as scripts get it: SageMaker's estimator shapes make the same job as
our own words (stored fields and the job process's environment alike), bad shapes are 400s
naming the key, TRAINYARD_DISTRIBUTION is one JSON object, and trainyard.env.read_distribution
reads it (and the older bare word)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.models import JobStatus, Node, TrainingJob
from jobs.runner.process.jobdir import JobDir, LaunchFacts, build_environment
from tests.jobs.conftest import SCRIPTS, run_to_end, stored_text
from trainyard.env import TrainingEnvironment, read_distribution
from trainyard.errors import DataError

MODELPARALLEL_2X4 = {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
    "partitions": 2, "microbatches": 4, "pipeline": "interleaved"}}}}


@pytest.fixture
def script_uri(owner, client_for) -> str:
    response = client_for(owner).post("/api/v1/scripts/", {"project": "acme", "file": SimpleUploadedFile(
        "train.py", (SCRIPTS / "print_distribution.py").read_bytes())}, format="multipart")
    assert response.status_code == 201, response.content
    return response.json()["uri"]


@pytest.fixture
def big_node(db) -> Node:
    """A node with room for every process count below (check_resources looks at the largest)."""
    return Node.objects.create(name="n1", hostname="h", queue="node.n1", cpus=16)


def job_body(script_uri: str, **overrides) -> dict:
    return {"project": "acme", "name": "dist", "script": {"uri": script_uri, "entry_point": "train.py"},
            "hyperparameters": {"epochs": 1}, **overrides}


def submit(client, body: dict):
    return client.post("/api/v1/jobs/", body, format="json")


def launched_environment(job: TrainingJob, tmp_path: Path) -> dict[str, str]:
    """What node 0's agent gives the job's processes, from the stored job (as agent.py builds it)."""
    facts = LaunchFacts(job_id=1, job_name="dist", attempt=1, node_rank=0, hosts=["n1"],
                        hyperparameters=dict(job.hyperparameters), channels={}, entry_point="train.py", num_gpus=0,
                        num_cpus=16, redis_url="redis://r:6379/0", environment=dict(job.environment),
                        distribution=job.distribution or "none", pipeline=dict(job.pipeline or {}))
    return build_environment(JobDir(tmp_path / "job"), facts, {"PATH": "/bin"})


STORED = ("distribution", "pipeline", "resources", "hyperparameters", "environment", "script")

SAME_JOBS = [
    pytest.param({"torch_distributed": {"enabled": True}}, {"distribution": "ddp"}, {"kind": "ddp"},
                 id="torch_distributed"),
    pytest.param({"pytorchddp": {"enabled": True}}, {"distribution": "ddp"}, {"kind": "ddp"}, id="pytorchddp"),
    pytest.param({"smdistributed": {"dataparallel": {"enabled": True}}}, {"distribution": "ddp"}, {"kind": "ddp"},
                 id="smdistributed.dataparallel"),
    pytest.param({"pytorchddp": {"enabled": False}}, {"distribution": "none"}, {"kind": "none"}, id="disabled"),
    pytest.param({}, {}, {"kind": "none"}, id="empty"),
    pytest.param({"mpi": {"enabled": True, "processes_per_host": 2}},
                 {"distribution": "ddp", "resources": {"processes_per_node": 2}}, {"kind": "ddp"}, id="mpi"),
    pytest.param(MODELPARALLEL_2X4, {"distribution": "pipeline", "pipeline": {"stages": 2, "microbatches": 4,
                                                                              "schedule": "1f1b"}},
                 {"kind": "pipeline", "stages": 2, "microbatches": 4, "schedule": "1f1b", "partition": "auto",
                  "memory_cap_mb": None, "ddp": False}, id="modelparallel"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                      "partitions": 2, "microbatches": 2, "pipeline": "simple", "ddp": True}}},
                  "mpi": {"enabled": True, "processes_per_host": 4}},
                 {"distribution": "pipeline", "resources": {"processes_per_node": 4},
                  "pipeline": {"stages": 2, "microbatches": 2, "schedule": "gpipe", "ddp": True}},
                 {"kind": "pipeline", "stages": 2, "microbatches": 2, "schedule": "gpipe", "partition": "auto",
                  "memory_cap_mb": None, "ddp": True}, id="modelparallel-ddp-replicas"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 3}}}},
                 {"distribution": "pipeline", "pipeline": {"stages": 3, "microbatches": 1, "schedule": "1f1b"}},
                 {"kind": "pipeline", "stages": 3, "microbatches": 1, "schedule": "1f1b", "partition": "auto",
                  "memory_cap_mb": None, "ddp": False}, id="modelparallel-sagemaker-defaults"),
]


@pytest.mark.parametrize(("sagemaker", "ours", "variable"), SAME_JOBS)
def test_sagemaker_shape_makes_the_same_job_as_our_own(owner, client_for, script_uri, big_node, tmp_path, sagemaker,
                                                       ours, variable):
    client = client_for(owner)
    theirs = submit(client, job_body(script_uri, distribution=sagemaker))
    mine = submit(client, job_body(script_uri, **ours))
    assert theirs.status_code == 201, theirs.content
    assert mine.status_code == 201, mine.content
    assert {name: theirs.json()[name] for name in STORED} == {name: mine.json()[name] for name in STORED}
    assert theirs.json()["distribution"] == variable["kind"]

    sagemaker_job, own_job = (TrainingJob.objects.get(pk=response.json()["id"]) for response in (theirs, mine))
    for name in ("distribution", "pipeline", "resources"):
        assert getattr(sagemaker_job, name) == getattr(own_job, name), name
    env = launched_environment(sagemaker_job, tmp_path)
    assert env == launched_environment(own_job, tmp_path)
    assert json.loads(env["TRAINYARD_DISTRIBUTION"]) == variable
    assert read_distribution(env) == variable
    assert json.loads(env["TRAINYARD_PIPELINE"]) == (sagemaker_job.pipeline or {})


def test_our_own_pipeline_says_ddp_across_replicas(owner, client_for, script_uri, big_node):
    response = submit(client_for(owner), job_body(script_uri, distribution="pipeline",
                                                  pipeline={"stages": 2, "ddp": True},
                                                  resources={"instance_count": 2, "processes_per_node": 2}))
    assert response.status_code == 201, response.content
    assert response.json()["pipeline"] == {"stages": 2, "microbatches": 4, "schedule": "gpipe", "partition": "auto",
                                           "ddp": True}
    # Without ddp nothing new is stored: earlier jobs' settings read the same.
    plain = submit(client_for(owner), job_body(script_uri, distribution="pipeline", pipeline={"stages": 2, "ddp": False}))
    assert plain.status_code == 201, plain.content
    assert "ddp" not in plain.json()["pipeline"]


BAD_SHAPES = [
    pytest.param({"horovod": {"enabled": True}}, "Unknown key 'horovod'; known: torch_distributed, pytorchddp, "
                 "smdistributed, mpi", id="unknown-top-level"),
    pytest.param({"torch_distributed": {"enabled": True, "nproc": 2}}, "Unknown key 'torch_distributed.nproc'",
                 id="unknown-in-torch_distributed"),
    pytest.param({"smdistributed": {"zero": {"enabled": True}}}, "Unknown key 'smdistributed.zero'; known: "
                 "dataparallel, modelparallel", id="unknown-in-smdistributed"),
    pytest.param({"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-x"}}},
                 "Unknown key 'smdistributed.dataparallel.custom_mpi_options'", id="unknown-in-dataparallel"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "params": {"partitions": 2}}}},
                 "Unknown key 'smdistributed.modelparallel.params'; known: enabled, parameters",
                 id="unknown-in-modelparallel"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 2, "foo": 1}}}},
                 "Unknown key 'smdistributed.modelparallel.parameters.foo'; known: partitions, microbatches, "
                 "pipeline, ddp", id="unknown-in-parameters"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": False, "parameters": {"foo": 1}}}},
                 "Unknown key 'smdistributed.modelparallel.parameters.foo'", id="unknown-even-when-disabled"),
    pytest.param({"mpi": {"enabled": True, "custom_mpi_options": "-x"}}, "Unknown key 'mpi.custom_mpi_options'",
                 id="unknown-in-mpi"),
    pytest.param({"torch_distributed": {"enabled": "true"}}, 'torch_distributed.enabled must be true or false, got '
                 '"true"', id="enabled-a-string"),
    pytest.param({"smdistributed": {"dataparallel": {"enabled": 1}}},
                 "smdistributed.dataparallel.enabled must be true or false, got 1", id="enabled-a-number"),
    pytest.param({"pytorchddp": {}}, "pytorchddp.enabled is required", id="enabled-missing"),
    pytest.param({"pytorchddp": True}, 'pytorchddp must be an object such as {"enabled": true}, got true',
                 id="section-not-an-object"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 0}}}},
                 "smdistributed.modelparallel.parameters.partitions must be a whole number from 2 to 64", id="partitions-0"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"microbatches": 4}}}},
                 "smdistributed.modelparallel.parameters.partitions is required", id="partitions-missing"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 2,
                                                                                        "microbatches": "4"}}}},
                 "smdistributed.modelparallel.parameters.microbatches must be a whole number", id="microbatches-a-string"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 2,
                                                                                        "pipeline": "zigzag"}}}},
                 'smdistributed.modelparallel.parameters.pipeline must be "interleaved" (the 1f1b schedule) or '
                 '"simple" (gpipe), got "zigzag"', id="pipeline-zigzag"),
    pytest.param({"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"partitions": 2, "ddp": "on"}}}},
                 "smdistributed.modelparallel.parameters.ddp must be true or false", id="ddp-not-a-bool"),
    pytest.param({"mpi": {"enabled": True, "processes_per_host": 0}}, "mpi.processes_per_host must be a whole number "
                 "from 1 to 256", id="processes-per-host-0"),
    pytest.param({"torch_distributed": {"enabled": True}, "smdistributed": {"dataparallel": {"enabled": True}}},
                 "torch_distributed and smdistributed.dataparallel are both enabled", id="two-strategies"),
    pytest.param([{"torch_distributed": {"enabled": True}}], "or a SageMaker distribution object", id="a-list"),
    pytest.param(2, "or a SageMaker distribution object", id="a-number"),
    pytest.param("zigzag", '"zigzag" is not a valid choice', id="unknown-word"),
]


@pytest.mark.parametrize(("distribution", "text"), BAD_SHAPES)
def test_bad_distribution_shapes_are_400s_naming_the_key(owner, client_for, script_uri, big_node, distribution, text):
    response = submit(client_for(owner), job_body(script_uri, distribution=distribution))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == ["distribution"], error
    assert text in error["fields"]["distribution"][0], error
    assert error["message"] == f"distribution: {error['fields']['distribution'][0]}"
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize(("overrides", "field", "text"), [
    pytest.param({"distribution": MODELPARALLEL_2X4, "pipeline": {"stages": 2}}, "pipeline",
                 "A SageMaker distribution object sets the pipeline itself", id="sagemaker-and-pipeline"),
    pytest.param({"distribution": {"pytorchddp": {"enabled": True}}, "pipeline": {"stages": 2}}, "pipeline",
                 "A SageMaker distribution object sets the pipeline itself", id="sagemaker-ddp-and-pipeline"),
    pytest.param({"distribution": {"mpi": {"enabled": True, "processes_per_host": 4}},
                  "resources": {"processes_per_node": 2}}, "distribution",
                 "mpi.processes_per_host is 4 but resources.processes_per_node is 2", id="two-process-counts"),
    pytest.param({"distribution": MODELPARALLEL_2X4, "resources": {"processes_per_node": 3}}, "pipeline.stages",
                 "2 stages need 2 processes (one per stage), but the job has instance_count × processes_per_node = 3",
                 id="world-not-the-stages"),
    pytest.param({"distribution": {"smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                      "partitions": 2, "ddp": True}}}, "mpi": {"enabled": True, "processes_per_host": 3}}},
                 "pipeline.stages", "2 stages with ddp need a multiple of 2 processes (one per stage in each replica), "
                 "but the job has instance_count × processes_per_node = 3", id="ddp-world-not-a-multiple"),
    pytest.param({"distribution": "pipeline", "pipeline": {"stages": 4, "ddp": True},
                  "resources": {"processes_per_node": 2}}, "pipeline.stages", "4 stages with ddp need a multiple of 4",
                 id="ddp-world-smaller-than-the-stages"),
])
def test_distribution_that_does_not_fit_the_job_names_the_field(owner, client_for, script_uri, big_node, overrides,
                                                                field, text):
    response = submit(client_for(owner), job_body(script_uri, **overrides))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert text in error["fields"][field][0], error
    assert not TrainingJob.objects.exists()


def test_schema_describes_distribution_as_a_word_or_a_sagemaker_object(db, client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    field = schema["components"]["schemas"]["JobCreateRequest"]["properties"]["distribution"]
    word, sagemaker = field["oneOf"]
    assert word == {"type": "string", "enum": ["none", "ddp", "fsdp", "pipeline"]}
    assert sagemaker["type"] == "object" and sagemaker["additionalProperties"] is False
    assert set(sagemaker["properties"]) == {"torch_distributed", "pytorchddp", "smdistributed", "mpi"}
    parameters = sagemaker["properties"]["smdistributed"]["properties"]["modelparallel"]["properties"]["parameters"]
    assert set(parameters["properties"]) == {"partitions", "microbatches", "pipeline", "ddp"}
    assert schema["components"]["schemas"]["PipelineRequest"]["properties"]["ddp"]["type"] == "boolean"


# --- read_distribution ------------------------------------------------------------------------------
PIPELINE_2 = {"kind": "pipeline", "stages": 2, "microbatches": 4, "schedule": "gpipe", "partition": "auto",
              "memory_cap_mb": None, "ddp": False}


@pytest.mark.parametrize(("environ", "expected"), [
    pytest.param({}, {"kind": "none"}, id="unset"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "  "}, {"kind": "none"}, id="blank"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "ddp"}, {"kind": "ddp"}, id="bare-word"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "fsdp"}'}, {"kind": "fsdp"}, id="object"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "ddp", "processes_per_node": 2}'},
                 {"kind": "ddp", "processes_per_node": 2}, id="extra-keys-kept"),
    pytest.param({"TRAINYARD_DISTRIBUTION": json.dumps({**PIPELINE_2, "schedule": "1f1b", "ddp": True}),
                  "TRAINYARD_PIPELINE": '{"stages": 9}'},
                 {**PIPELINE_2, "schedule": "1f1b", "ddp": True}, id="pipeline-object-wins"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "pipeline", "TRAINYARD_PIPELINE": '{"stages": 2, "partition": [1, 3]}'},
                 {**PIPELINE_2, "partition": [1, 3]}, id="bare-pipeline-folds-in-TRAINYARD_PIPELINE"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "microbatches": 8}',
                  "TRAINYARD_PIPELINE": '{"stages": 3, "microbatches": 2, "memory_cap_mb": 512}'},
                 {**PIPELINE_2, "stages": 3, "microbatches": 8, "memory_cap_mb": 512}, id="object-lacks-some"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "pipeline", "WORLD_SIZE": "2"}, PIPELINE_2, id="by-hand-stages-from-world"),
])
def test_read_distribution(environ, expected):
    assert read_distribution(environ) == expected
    assert TrainingEnvironment.from_env(environ).distribution == expected


@pytest.mark.parametrize(("environ", "text"), [
    pytest.param({"TRAINYARD_DISTRIBUTION": "{kind: ddp}"}, "TRAINYARD_DISTRIBUTION is not valid JSON", id="bad-json"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '["ddp"]'}, "TRAINYARD_DISTRIBUTION must be a JSON object", id="a-list"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"stages": 2}'}, 'TRAINYARD_DISTRIBUTION needs "kind"', id="no-kind"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "zigzag"}, "TRAINYARD_DISTRIBUTION: unknown kind 'zigzag'; use one of "
                 "none, ddp, fsdp, pipeline", id="unknown-word"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "tensor"}'}, "unknown kind 'tensor'", id="unknown-kind"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "pipeline"}, 'pipeline needs "stages"', id="pipeline-without-stages"),
    pytest.param({"TRAINYARD_DISTRIBUTION": "pipeline", "TRAINYARD_PIPELINE": "{"},
                 "TRAINYARD_PIPELINE is not valid JSON", id="bad-pipeline-json"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "stages": 2, "schedule": "zigzag"}'},
                 "pipeline schedule must be one of gpipe, 1f1b, got 'zigzag'", id="bad-schedule"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "stages": 0}'},
                 "pipeline stages must be a whole number ≥ 1, got 0", id="bad-stages"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "stages": 2, "ddp": "yes"}'},
                 "pipeline ddp must be true or false", id="bad-ddp"),
    pytest.param({"TRAINYARD_DISTRIBUTION": '{"kind": "pipeline", "stages": 2, "partition": "zigzag"}'},
                 'pipeline partition must be "auto", "even" or a list', id="bad-partition"),
])
def test_read_distribution_says_what_a_hand_made_value_gets_wrong(environ, text):
    with pytest.raises(DataError) as caught:
        read_distribution(environ)
    assert text in str(caught.value)
    # from_env itself does not fail: the distribution is read where it is used.
    with pytest.raises(DataError):
        _ = TrainingEnvironment.from_env(environ).distribution


# --- a real job -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_script_job_reads_its_distribution_as_json(node, owner, client_for, script_uri):
    """Submitted in SageMaker's shape, run by the node worker: each process gets the JSON."""
    response = submit(client_for(owner), job_body(script_uri, distribution=MODELPARALLEL_2X4))
    assert response.status_code == 201, response.content
    job = run_to_end(TrainingJob.objects.get(pk=response.json()["id"]), timeout=120)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    expected = {"kind": "pipeline", "stages": 2, "microbatches": 4, "schedule": "1f1b", "partition": "auto",
                "memory_cap_mb": None, "ddp": False}
    for rank in (0, 1):
        log = stored_text(f"{job.output_uri}/logs/rank-{rank}.log")
        for marker in ("TRAINYARD_DISTRIBUTION=", "read_distribution="):
            line = next((line for line in log.splitlines() if marker in line), None)
            assert line is not None, (marker, log[-2000:])
            assert json.loads(line.split(marker, 1)[1]) == expected, line


def test_a_built_in_refuses_pipeline_replicas_naming_pipeline_ddp(owner, client_for, big_node, make_version):
    version = make_version({"train.txt": "the quick brown fox jumps over the lazy dog.\n" * 50}, name="fox")
    body = {"project": "acme", "name": "lm", "algorithm": "char-lm", "distribution": "pipeline",
            "inputs": {"train": version.pk},
            "pipeline": {"stages": 2, "ddp": True}, "resources": {"processes_per_node": 4}}
    response = submit(client_for(owner), body)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert "replicas of it (ddp) are for scripts" in fields.get("pipeline.ddp", [""])[0], fields
    assert not TrainingJob.objects.exists()
