"""The CLI's refusals against a live studio (no worker needed): the API's own message and
field names, exit code 2 for a 4xx, 3 for a studio that cannot be reached, never a traceback."""

from __future__ import annotations

import json
import os
import stat

from jobs.models import TrainingJob
from studio.models import ApiToken
from tests.client.conftest import SCRIPTS
from tests.e2e.conftest import PASSWORD
from tests.factories import make_member


def test_instance_count_zero_prints_the_apis_message_naming_the_field(studio, cli):
    result = cli("run", str(SCRIPTS / "failing" / "train.py"), "--instance-count", "0")

    assert result.returncode == 2, result.stdout + result.stderr
    assert "resources.instance_count: Ensure this value is greater than or equal to 1." in result.stderr
    assert "Traceback" not in result.stderr
    assert not TrainingJob.objects.exists()


def test_job_fields_and_a_sagemaker_distribution_reach_the_job_under_the_apis_names(studio, cli):
    result = cli("run", str(SCRIPTS / "failing" / "train.py"), "--name", "shaped", "--distribution",
                 '{"pytorchddp": {"enabled": true}}', "--processes-per-node", "2", "--tag", "nightly", "--env", "SEED=7",
                 "--max-runtime", "60", "--retries", "1", "--checkpoint-every", "50", "--keep-alive", "30", "--json")

    assert result.returncode == 0, result.stdout + result.stderr
    job = TrainingJob.objects.get(name="shaped")
    assert json.loads(result.stdout)["id"] == job.pk
    assert (job.distribution, job.resources["processes_per_node"], job.tags, job.environment) == ("ddp", 2, ["nightly"],
                                                                                                  {"SEED": "7"})
    assert (job.stopping, job.retries, job.checkpoint["every_steps"], job.keep_alive_seconds) == (
        {"max_runtime_seconds": 60}, 1, 50, 30)


def test_pipeline_without_stages_and_an_unknown_distribution_key_get_the_apis_messages(studio, cli):
    script = str(SCRIPTS / "failing" / "train.py")

    no_stages = cli("run", script, "--distribution", "pipeline")
    assert no_stages.returncode == 2
    assert 'pipeline: distribution "pipeline" needs pipeline: {"stages": K, ...}.' in no_stages.stderr, no_stages.stderr

    unknown = cli("run", script, "--distribution", '{"pytorchddp": {"enabled": true, "turbo": 1}}')
    assert unknown.returncode == 2, unknown.stderr
    assert "distribution: Unknown key 'pytorchddp.turbo'; known: enabled." in unknown.stderr, unknown.stderr
    assert not TrainingJob.objects.exists()


def test_a_bad_token_and_an_unknown_project_are_refused_with_the_studios_words(studio, cli):
    bad_token = cli("jobs", "list", env={**studio.env, "TRAINYARD_TOKEN": "ty_nope_nope"})
    assert bad_token.returncode == 2
    assert "Invalid, expired or revoked token." in bad_token.stderr and "Traceback" not in bad_token.stderr

    no_project = cli("run", str(SCRIPTS / "failing" / "train.py"), "--project", "nowhere")
    assert no_project.returncode == 2
    assert "project: No such project." in no_project.stderr


def test_an_unreachable_studio_says_the_url_could_not_be_reached(studio, cli):
    result = cli("jobs", "list", env={**studio.env, "TRAINYARD_URL": "http://127.0.0.1:9"})

    assert result.returncode == 3
    assert "Could not reach the studio at http://127.0.0.1:9" in result.stderr and "Traceback" not in result.stderr


def test_login_with_a_password_stores_a_token_readable_by_the_user_only(studio, cli, project, tmp_path):
    make_member(project, "sam", "scientist", password=PASSWORD)
    env = {k: v for k, v in studio.env.items() if k not in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_PROJECT")}

    result = cli("login", studio.url, "--username", "sam", input=f"{PASSWORD}\n", env=env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "projects: acme (scientist)" in result.stdout
    stored = tmp_path / "config" / "trainyard" / "credentials.json"
    assert stat.S_IMODE(os.stat(stored).st_mode) == 0o600
    token = json.loads(stored.read_text())["token"]
    assert ApiToken.authenticate(token).user.username == "sam"
    # Later commands use the stored login.
    listed = cli("datasets", "list", "--json", env=env)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr

    wrong = cli("login", studio.url, "--username", "sam", input="not-it\n", env=env)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr

    # Asked for a token (none given on the command line), the owner's is stored instead.
    with_token = cli("login", studio.url, "--project", "acme", input=f"{studio.token}\n", env=env)
    assert with_token.returncode == 0, with_token.stdout + with_token.stderr
    assert json.loads(stored.read_text()) == {"url": studio.url, "token": studio.token, "project": "acme"}
    assert "projects: acme (admin)" in with_token.stdout


def test_a_field_misplaced_through_the_python_client_is_refused_naming_where_it_belongs(studio):
    # Studio.run passes unknown keyword fields through under their API names: a top-level
    # max_runtime_seconds used to be dropped, and the job ran with no limit.
    import pytest

    from trainyard.client.http import ApiError
    from trainyard.client.studio import Studio as Client

    client = Client(studio.url, studio.token)
    with pytest.raises(ApiError) as refused:
        client.run(str(SCRIPTS / "failing" / "train.py"), max_runtime_seconds=60)
    assert refused.value.status == 400
    assert "max_runtime_seconds: is not a field here; did you mean stopping.max_runtime_seconds?" in str(refused.value)
    assert not TrainingJob.objects.exists()
