"""A script folder's requirements.txt: a job environment on the node, layered on its Python
(jobs.runner.process.envs), built by the first job that names it and reused by the next.

Packages come from wheels written by the test into a folder given through
STUDIO_PIP_FIND_LINKS, with STUDIO_PIP_INDEX_URL=none: nothing reaches a network."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import json
import subprocess
import tarfile
import threading
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from datasets.storage import default_store, object_uri, store_for
from jobs.models import FINISHED_STATUSES, JobStatus, Node, NodeState, TrainingJob
from jobs.nodes import register_node
from jobs.runner.process import envs
from jobs.transitions import transition
from tests.conftest import wait_for
from tests.jobs.conftest import NodeWorker, node_env, run_to_end, start_worker, stop_worker
from tests.jobs.test_warm_ready import fork_servers

TORCH = importlib.metadata.version("torch")
NUMPY = importlib.metadata.version("numpy")
NO_INDEX = envs.Sources(index_url=envs.NO_INDEX)

# Prints what it imported and from where, and keeps it in the model for the test to read.
TRAIN = '''
import json, os, sys
import numpy, torch
import tiny_greeting, tiny_numbers
seen = {"greeting": tiny_greeting.GREETING, "total": tiny_numbers.total([1, 2, 3]), "executable": sys.executable,
        "prefix": sys.prefix, "torch": torch.__file__, "numpy": numpy.__file__, "torch_preloaded": "torch" in sys.modules}
print("requirements-seen:", json.dumps(seen), flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w") as out:
    json.dump(seen, out)
'''
GOOD = "# what train.py imports\ntiny-greeting==1.0\ntiny_numbers  # needs numpy: the node's\n"


def write_wheel(folder: Path, name: str, version: str, code: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of one module, RECORD and all (what a build backend would write)."""
    module, dist_info = name.replace("-", "_"), f"{name.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": code,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: trainyard-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    write_wheel(folder, "tiny-greeting", "1.0", 'GREETING = "hello from a wheel"\n')
    write_wheel(folder, "tiny-numbers", "1.0", "import numpy\n\ndef total(values):\n    return int(numpy.sum(values))\n",
                requires=("numpy>=1.20",))
    write_wheel(folder, "tiny-old-torch-user", "1.0", "", requires=("torch<2",))
    return folder


# --- the file and the environment, without a worker ---------------------------------------------
def requirements_of(tmp_path: Path, text: str) -> envs.Requirements:
    path = tmp_path / f"requirements-{uuid.uuid4().hex[:6]}.txt"
    path.write_text(text)
    return envs.read_requirements(path)


def test_equal_requirements_written_differently_share_one_environment_key(tmp_path):
    a = requirements_of(tmp_path, GOOD)
    b = requirements_of(tmp_path, "Tiny_Numbers\n\n   tiny-greeting == 1.0 # pinned\n")
    assert a.lines == ("tiny-greeting==1.0", "tiny-numbers") and a == b and a.describe() == "2 requirements"
    node = envs.NodePython()
    assert envs.environment_key(a, node, NO_INDEX) == envs.environment_key(b, node, NO_INDEX)
    assert envs.environment_key(a, node, NO_INDEX) != envs.environment_key(requirements_of(tmp_path, "tiny-greeting\n"),
                                                                         node, NO_INDEX)
    other_python = envs.NodePython(executable="/opt/other/bin/python")
    assert envs.environment_key(a, node, NO_INDEX) != envs.environment_key(a, other_python, NO_INDEX)


@pytest.mark.parametrize(("line", "reason"), [
    ("torch==1.0", f"requirements.txt: torch==1.0 would replace the node's torch {TORCH} (the SDK and CUDA are "
                   "paired with it); remove the line"),
    ("numpy", f"requirements.txt: numpy would replace the node's numpy {NUMPY} (torch and the SDK are built against "
              "it); remove the line"),
    ("NVIDIA_cublas_cu12>=12", "requirements.txt: NVIDIA_cublas_cu12>=12 would replace the node's"),
    ("-r more.txt", "requirements.txt line 2: options such as -r are not accepted here"),
    ("--index-url=https://example.org/simple", "requirements.txt line 2: options such as --index-url are not accepted"),
    ("-e ./src", "requirements.txt line 2: options such as -e are not accepted"),
    ("tiny-greeting --hash=sha256:00", "requirements.txt line 2: per-line options such as --hash are not accepted"),
    ("tiny greeting", "requirements.txt line 2: 'tiny greeting' is not a requirement"),
])
def test_lines_that_would_replace_the_nodes_packages_or_are_options_are_refused(tmp_path, line, reason):
    with pytest.raises(envs.RequirementsError) as refused:
        requirements_of(tmp_path, f"# first\n{line}\n")
    assert str(refused.value).startswith(reason)


def test_an_environment_sees_its_packages_and_the_nodes_and_two_builders_install_once(tmp_path, wheelhouse):
    requirements = requirements_of(tmp_path, GOOD)
    sources = envs.Sources.of(envs.NO_INDEX, str(wheelhouse))
    results: list[envs.JobEnvironment] = []
    announced: list[str] = []
    builders = [threading.Thread(target=lambda: results.append(envs.ensure_environment(
        requirements, tmp_path / "envs", sources=sources, announce=announced.append))) for _ in range(2)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(60)

    assert sorted(result.reused for result in results) == [False, True]
    assert announced == ["installing 2 requirements from requirements.txt"]
    [path] = [p for p in (tmp_path / "envs").iterdir() if p.is_dir()]  # no build folder left either
    assert results[0].path == results[1].path == path and (path / envs.MARKER_FILE).is_file()
    shown = subprocess.run([results[0].python, "-c", "import json, numpy, torch, tiny_greeting, tiny_numbers; "
                            "print(json.dumps([tiny_greeting.GREETING, tiny_numbers.total([2, 3]), torch.__version__, "
                            "numpy.__file__]))"], capture_output=True, text=True, timeout=120)
    greeting, total, torch_version, numpy_file = json.loads(shown.stdout or "null") or [None] * 4
    assert (greeting, total, torch_version) == ("hello from a wheel", 5, TORCH), shown.stderr
    assert not numpy_file.startswith(str(path)), "numpy is the node's, never installed into the environment"


def test_a_package_that_needs_another_torch_fails_the_build_naming_both(tmp_path, wheelhouse):
    requirements = requirements_of(tmp_path, "tiny-old-torch-user\n")
    with pytest.raises(envs.RequirementsError) as failed:
        envs.ensure_environment(requirements, tmp_path / "envs", sources=envs.Sources.of(envs.NO_INDEX, str(wheelhouse)))
    assert str(failed.value) == (f"requirements.txt: tiny-old-torch-user 1.0 needs torch<2, but the node has torch "
                                 f"{TORCH}; pin a release of tiny-old-torch-user made for it")
    assert [p.name for p in (tmp_path / "envs").iterdir() if p.is_dir()] == []


def test_without_uv_pip_installs_and_a_failure_is_pips_own_message(tmp_path, wheelhouse, monkeypatch):
    monkeypatch.setattr(envs, "find_uv", lambda: "")  # a node without uv
    sources = envs.Sources.of(envs.NO_INDEX, str(wheelhouse))
    built = envs.ensure_environment(requirements_of(tmp_path, "tiny-greeting\n"), tmp_path / "envs", sources=sources)
    assert built.installer == "pip" and any(built.path.glob("lib/python*/site-packages/tiny_greeting/__init__.py"))
    with pytest.raises(envs.RequirementsError) as failed:
        envs.ensure_environment(requirements_of(tmp_path, "tiny-greeting\nno-such-package==9.9\n"), tmp_path / "envs",
                                sources=sources)
    assert str(failed.value).startswith("requirements.txt: Could not find a version that satisfies the requirement "
                                        "no-such-package==9.9")


def test_installer_output_is_trimmed_to_what_went_wrong():
    uv = ("Using Python 3.11.7 environment at: /data/envs/.build-x\n"
          "  × No solution found when resolving dependencies:\n"
          "error: No solution found when resolving dependencies\n"
          "  cause: Because foo was not found in the package registry and you require foo==9.9, we can conclude "
          "that your requirements are unsatisfiable.\n")
    assert envs.installer_message(uv) == (
        "No solution found when resolving dependencies: Because foo was not found in the package registry and you "
        "require foo==9.9, we can conclude that your requirements are unsatisfiable.")
    pip = ("Looking in links: /wheels\nProcessing ./a.whl\nERROR: Cannot install a==1.0 because these package versions "
           "have conflicting dependencies.\n\nThe conflict is caused by:\n    a 1.0 depends on torch<2\n\n"
           "To fix this you could try to:\n1. loosen the range\n\nERROR: ResolutionImpossible: for help visit "
           "https://pip.pypa.io/\n")
    assert envs.installer_message(pip) == ("Cannot install a==1.0 because these package versions have conflicting "
                                           "dependencies.\nThe conflict is caused by:\na 1.0 depends on torch<2")


# --- as jobs, on a node worker ------------------------------------------------------------------
@pytest.fixture(scope="module")
def env_worker(django_db_setup, isolated_storage, tmp_path_factory, wheelhouse) -> Iterator[NodeWorker]:
    """A node worker whose installs come from the test's wheels only."""
    base = tmp_path_factory.mktemp("env-node")
    env = {**node_env(isolated_storage, base / "data"), "STUDIO_PIP_INDEX_URL": envs.NO_INDEX,
           "STUDIO_PIP_FIND_LINKS": str(wheelhouse)}
    worker = start_worker(f"test-env-node-{uuid.uuid4().hex[:6]}", env, base / "worker.log")
    try:
        yield worker
    finally:
        stop_worker(worker)


@pytest.fixture
def env_node(env_worker: NodeWorker, transactional_db) -> Iterator[Node]:
    assert env_worker.alive(), env_worker.log()[-5000:]
    yield register_node(name=env_worker.name, instance_type="cpu", pid=env_worker.process.pid)
    for job in TrainingJob.objects.exclude(status__in=FINISHED_STATUSES):
        transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING])
    wait_for(lambda: not Node.objects.filter(name=env_worker.name, state=NodeState.BUSY).exists(), timeout=60,
             message="the node to be released")
    assert env_worker.alive(), env_worker.log()[-5000:]


def script_folder(project, requirements: str, name: str = "") -> str:
    """A source folder (train.py and requirements.txt) uploaded as the API stores one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member, text in (("train.py", TRAIN), ("requirements.txt", requirements)):
            info = tarfile.TarInfo(member)
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
    uri = object_uri(f"scripts/{project.slug}/tests/{name or uuid.uuid4().hex[:8]}.tar.gz")
    with default_store().open_write(uri) as out:
        out.write(buffer.getvalue())
    return uri


def seen_by(job: TrainingJob) -> dict:
    with store_for(job.model_uri).open_read(job.model_uri) as source, \
            tarfile.open(fileobj=io.BytesIO(source.read()), mode="r:gz") as archive:
        member = next(m for m in archive.getmembers() if Path(m.name).name == "seen.json")
        extracted = archive.extractfile(member)
        assert extracted is not None
        return json.loads(extracted.read())


def timeline(job: TrainingJob) -> list[str]:
    return list(job.events.order_by("at", "pk").values_list("message", flat=True))


def built_environments(worker: NodeWorker) -> list[Path]:
    folder = worker.data_dir / "envs"
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def seconds_between(job: TrainingJob, first: str, then: str) -> float:
    events = list(job.events.order_by("at", "pk").values_list("status", "at"))
    start = next(at for status, at in events if status == first)
    end = next(at for status, at in events if status == then)
    return (end - start).total_seconds()


@pytest.mark.slow
def test_a_script_imports_its_requirements_and_the_next_job_reuses_the_environment(env_node, env_worker, make_job,
                                                                                    project):
    uri = script_folder(project, GOOD)
    first = run_to_end(make_job(script_uri=uri, entry_point="train.py"), timeout=180)

    assert first.status == JobStatus.COMPLETED, first.failure_reason
    notes = timeline(first)
    assert f"node {env_node.name}: installing 2 requirements from requirements.txt" in notes
    [installed] = [n for n in notes if n.startswith(f"node {env_node.name}: installed 2 requirements in ")]
    assert installed.endswith(" s (uv)")
    [environment] = built_environments(env_worker)
    seen = seen_by(first)
    assert (seen["greeting"], seen["total"]) == ("hello from a wheel", 6)
    assert seen["prefix"] == str(environment) and seen["executable"] == str(environment / "bin" / "python")
    assert not seen["torch"].startswith(str(environment)) and not seen["numpy"].startswith(str(environment))
    marker = environment / envs.MARKER_FILE
    built = (marker.stat().st_mtime_ns, marker.read_text())
    site_packages = next(environment.glob("lib/python*/site-packages"))
    installed_at = site_packages.stat().st_mtime_ns

    # The same packages, written another way: the same environment, nothing installed.
    again = script_folder(project, "tiny_numbers\ntiny-greeting == 1.0\n")
    second = run_to_end(make_job(script_uri=again, entry_point="train.py"), timeout=180)

    assert second.status == JobStatus.COMPLETED, second.failure_reason
    notes = timeline(second)
    assert f"node {env_node.name}: reused the environment for requirements.txt (2 requirements)" in notes
    assert not [n for n in notes if "installing" in n or "installed" in n]
    assert built_environments(env_worker) == [environment]
    assert (marker.stat().st_mtime_ns, marker.read_text()) == built
    assert site_packages.stat().st_mtime_ns == installed_at
    assert seen_by(second)["prefix"] == str(environment)
    install_seconds = json.loads(built[1])["seconds"]
    print(f"\nrequirements: first job installed in {install_seconds:.2f} s (Starting→Training "
          f"{seconds_between(first, 'Starting', 'Training'):.2f} s); reused: Starting→Training "
          f"{seconds_between(second, 'Starting', 'Training'):.2f} s")


@pytest.mark.slow
def test_a_package_that_cannot_be_installed_fails_the_job_with_the_installers_message(env_node, env_worker, make_job,
                                                                                     project):
    job = run_to_end(make_job(script_uri=script_folder(project, "tiny-greeting\nno-such-package==9.9\n"),
                              entry_point="train.py"), timeout=120)

    assert job.status == JobStatus.FAILED
    assert job.failure_reason.startswith("requirements.txt: No solution found when resolving dependencies: Because "
                                         "no-such-package was not found in the provided package locations and you "
                                         "require no-such-package==9.9"), job.failure_reason
    statuses = set(job.events.values_list("status", flat=True))
    assert JobStatus.TRAINING not in statuses  # it failed before training
    assert f"node {env_node.name}: installing 2 requirements from requirements.txt" in timeline(job)
    assert not any(p.name.startswith(".build-") for p in (env_worker.data_dir / "envs").iterdir())
    assert env_worker.alive()


@pytest.mark.slow
def test_torch_in_requirements_is_refused_before_anything_is_installed(env_node, env_worker, make_job, project):
    before = built_environments(env_worker)
    job = run_to_end(make_job(script_uri=script_folder(project, "tiny-greeting\ntorch==1.0\n"), entry_point="train.py"),
                     timeout=120)

    assert job.status == JobStatus.FAILED
    assert job.failure_reason == (f"requirements.txt: torch==1.0 would replace the node's torch {TORCH} (the SDK and "
                                  "CUDA are paired with it); remove the line")
    assert not [n for n in timeline(job) if "installing" in n]
    assert built_environments(env_worker) == before


@pytest.mark.slow
def test_a_warm_pool_forks_the_jobs_of_an_environment_from_its_python(env_node, env_worker, make_job, project):
    """The pool's fork server runs the environment's Python, so its next job with the same
    requirements forks with the packages; a job of the node's own Python starts cold."""
    uri = script_folder(project, GOOD)
    first = run_to_end(make_job(script_uri=uri, entry_point="train.py", keep_alive_seconds=120), timeout=180)
    assert first.status == JobStatus.COMPLETED, first.failure_reason
    wait_for(lambda: Node.objects.filter(pk=env_node.pk, state=NodeState.WARM).exists(), timeout=30,
             message="the node to turn warm")
    [environment] = [p for p in built_environments(env_worker) if seen_by(first)["prefix"] == str(p)]

    second = run_to_end(make_job(script_uri=uri, entry_point="train.py", keep_alive_seconds=120), timeout=180)

    assert second.status == JobStatus.COMPLETED, second.failure_reason
    assert second.warm_pool == f"pool-{first.pk}"
    seen = seen_by(second)
    assert seen["torch_preloaded"], "forked from the pool's server, torch imported already"
    assert (seen["greeting"], seen["prefix"]) == ("hello from a wheel", str(environment))
    assert not [n for n in timeline(second) if "starting cold" in n]
    [server] = fork_servers(env_worker)
    assert psutil.Process(server).cmdline()[0] == str(environment / "bin" / "python")

    # A job without requirements.txt in the same pool: the node's Python, so a cold start.
    third = run_to_end(make_job(script="quick.py", keep_alive_seconds=0), timeout=120)
    assert third.status == JobStatus.COMPLETED, third.failure_reason
    assert third.warm_pool == f"pool-{first.pk}"
    assert [n for n in timeline(third) if "starting cold" in n and str(environment) in n]
