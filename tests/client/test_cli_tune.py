"""`trainyard tune`: a search from a JSON spec whose base job is a script the CLI uploads,
listed, shown and stopped; a bad spec is refused with the API's field names."""

from __future__ import annotations

import json

import pytest

from tests.client.conftest import SCRIPTS
from tests.conftest import wait_for
from tuning.models import TuningJob

pytestmark = pytest.mark.slow


def test_tune_create_list_show_and_stop_with_a_script_uploaded_as_the_base_job(running_studio, cli, tmp_path):
    spec = tmp_path / "search.json"
    spec.write_text(json.dumps({
        "name": "lr-search", "base_job": {"resources": {"instance_type": "cpu", "instance_count": 1}},
        "parameter_ranges": {"lr": {"type": "continuous", "min": 0.01, "max": 0.1, "scale": "log"}},
        "objective": {"metric": "loss", "goal": "minimize"}, "max_trials": 4,
    }))

    created = cli("tune", "create", "--spec", str(spec), "--max-parallel", "1",
                  "--entry-point", str(SCRIPTS / "endless" / "train.py"), "--json")

    assert created.returncode == 0, created.stdout + created.stderr
    body = json.loads(created.stdout)
    tuning = TuningJob.objects.get(pk=body["id"])
    assert (tuning.name, tuning.max_trials, tuning.max_parallel) == ("lr-search", 4, 1)
    assert body["base_job"]["script"]["entry_point"] == "train.py"
    listed = cli("tune", "list")
    assert "lr-search" in listed.stdout, listed.stdout + listed.stderr
    shown = cli("tune", "show", str(tuning.pk), "--json")
    assert json.loads(shown.stdout)["parameter_ranges"]["lr"]["max"] == 0.1

    stopped = cli("tune", "stop", str(tuning.pk))

    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: TuningJob.objects.get(pk=tuning.pk).status in ("Stopping", "Stopped"), timeout=30,
             message="the tuning job to stop")


def test_a_bad_tuning_spec_prints_the_apis_field_messages(studio, cli, tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"name": "bad", "base_job": {"algorithm": "tabular-classifier"}, "parameter_ranges": {},
                                "max_trials": 0}))

    result = cli("tune", "create", "--spec", str(spec))

    assert result.returncode == 2, result.stdout + result.stderr
    assert "max_trials: Ensure this value is greater than or equal to 1." in result.stderr
    assert not TuningJob.objects.exists()

    not_json = tmp_path / "broken.json"
    not_json.write_text("{")
    broken = cli("tune", "create", "--spec", str(not_json))
    assert broken.returncode == 2 and "spec: " in broken.stderr and "is not JSON" in broken.stderr
