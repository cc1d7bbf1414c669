"""The client's own pieces without a studio: what a source folder packs to, how --hp
values are read, the stored login's file mode, and the error envelope's field paths."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from trainyard.client.config import Credentials, NotLoggedIn, resolve_credentials, save_credentials
from trainyard.client.http import flatten_fields, parse_events
from trainyard.client.pack import PackError, pack_source
from trainyard.client.studio import ClientError, parse_hyperparameter


def archive_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return archive.getnames()


def test_pack_honours_gitignores_and_never_sends_virtualenvs_git_or_caches(source_dir):
    (source_dir / "pkg").mkdir()
    (source_dir / "pkg" / ".gitignore").write_text("local.py\n")
    (source_dir / "pkg" / "local.py").write_text("x = 1\n")
    (source_dir / "pkg" / "model.py").write_text("x = 2\n")

    packed = pack_source(source_dir, max_file_bytes=50_000)

    expected = ["helpers.py", "keep.log", "pkg/.gitignore", "pkg/model.py", "train.py", ".gitignore"]
    assert sorted(packed.files) == sorted(expected)
    assert sorted(archive_names(packed.data)) == sorted(expected)
    assert [(s.path, s.reason.split(",")[0]) for s in packed.skipped] == [("data.bin", "97.7 KiB")]


def test_pack_keeps_big_files_under_the_limit_and_refuses_an_empty_folder(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 100_000)
    packed = pack_source(tmp_path)
    assert packed.files == ["train.py", "weights.bin"] and packed.skipped == []
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as archive:
        assert archive.getmember("weights.bin").size == 100_000

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PackError, match="has no files to send"):
        pack_source(empty)


def test_a_link_out_of_the_folder_is_left_out_and_said(tmp_path):
    (tmp_path / "outside.txt").write_text("secret\n")
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "train.py").write_text("print(1)\n")
    (folder / "leak.txt").symlink_to(tmp_path / "outside.txt")

    packed = pack_source(folder)

    assert packed.files == ["train.py"]
    assert [(s.path, s.reason) for s in packed.skipped] == [("leak.txt", "a link to something outside the folder")]


@pytest.mark.parametrize(("raw", "expected"), [
    ("epochs=5", ("epochs", 5)), ("lr=0.1", ("lr", 0.1)), ("amp=true", ("amp", True)), ("opt=adam", ("opt", "adam")),
    ("tag=\"7\"", ("tag", "7")), ("ids=[1,2]", ("ids", "[1,2]")), ("x=NaN", ("x", "NaN")), ("empty=", ("empty", "")),
    ("expr=a=b", ("expr", "a=b")),
])
def test_hyperparameters_read_json_scalars_and_keep_other_text(raw, expected):
    assert parse_hyperparameter(raw) == expected


def test_a_hyperparameter_without_a_name_is_refused_naming_the_field():
    with pytest.raises(ClientError, match="^hyperparameters: 'lr': write it as name=value"):
        parse_hyperparameter("lr")


def test_the_stored_login_is_mode_0600_and_the_environment_overrides_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    path = save_credentials(Credentials(url="http://studio:8000", token="ty_a_b", project="acme"))

    assert path == tmp_path / "trainyard" / "credentials.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert resolve_credentials() == Credentials("http://studio:8000", "ty_a_b", "acme")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_c_d")
    assert resolve_credentials().token == "ty_c_d"
    # The stored token is never sent to another studio than the one it came from.
    monkeypatch.delenv("TRAINYARD_TOKEN")
    monkeypatch.setenv("TRAINYARD_URL", "http://elsewhere:8000")
    with pytest.raises(NotLoggedIn, match="No API token for http://elsewhere:8000"):
        resolve_credentials()
    monkeypatch.setenv("TRAINYARD_URL", "studio:8000/")
    assert resolve_credentials().token == "ty_a_b"


def test_nested_envelope_fields_become_dotted_paths():
    fields = {"resources": {"instance_count": ["Ensure this value is greater than or equal to 1."]},
              "metric_definitions": [{}, {"regex": ["Needs a capture group."]}], "non_field_errors": ["Bad."]}

    assert flatten_fields(fields) == {"resources.instance_count": ["Ensure this value is greater than or equal to 1."],
                                      "metric_definitions.1.regex": ["Needs a capture group."], "non_field_errors": ["Bad."]}


def test_server_sent_events_are_parsed_with_their_ids_and_comments_skipped():
    lines = ["retry: 2000", "", ": keep-alive", "", "id: 1-0,0-0,0-0,0-0", "event: status",
             'data: {"status": "Training"}', "", "id: 1-0,2-0,0-0,0-0", "event: log", "data: not json", ""]

    events = list(parse_events(iter(lines)))

    assert [(e.kind, e.id, e.data) for e in events] == [("status", "1-0,0-0,0-0,0-0", {"status": "Training"}),
                                                        ("log", "1-0,2-0,0-0,0-0", "not json")]


def test_rules_are_read_as_json_a_type_a_list_or_a_file(tmp_path):
    from trainyard.client.cli import parse_rules

    listed = tmp_path / "rules.json"
    listed.write_text('[{"type": "overfit"}, {"type": "non_finite", "enabled": false}]')
    one = '{"type": "stalled", "parameters": {"threshold_seconds": 600}, "actions": ["stop"]}'
    assert parse_rules(()) is None
    assert parse_rules((one, "overtraining", f"@{listed}")) == [
        {"type": "stalled", "parameters": {"threshold_seconds": 600}, "actions": ["stop"]}, {"type": "overtraining"},
        {"type": "overfit"}, {"type": "non_finite", "enabled": False}]
    for bad, said in (("{not json", "not JSON"), ("two words", "give a rule as JSON"), ("@" + str(tmp_path / "none.json"),
                                                                                        "cannot read")):
        with pytest.raises(ClientError, match=said) as caught:
            parse_rules((bad,))
        assert caught.value.field == "rules"


def test_a_job_a_rule_stopped_says_which_rule_and_what_it_saw():
    from trainyard.client.follow import summary
    from trainyard.client.studio import Job

    data = {"id": 7, "status": "Stopped", "failure_reason": "", "stop_reason": "RuleTriggered", "stop_rule": "non_finite",
            "rules": [{"name": "stalled", "state_reason": "ok"},
                      {"name": "non_finite", "state_reason": "train_loss was NaN at step 12 (rank 0)"}]}
    assert summary(Job(None, data)) == "job 7 Stopped: RuleTriggered (rule non_finite: train_loss was NaN at step 12 (rank 0))"  # type: ignore[arg-type]
    assert summary(Job(None, {**data, "stop_rule": "", "stop_reason": "MaxRuntimeExceeded"})) == (  # type: ignore[arg-type]
        "job 7 Stopped: MaxRuntimeExceeded")


def test_costs_print_to_the_cent_and_times_to_the_second():
    # `jobs show` printed the API's "0.354167 USD" and `alarms` an ISO time with microseconds
    # that the terminal's columns cut: both as the pages show them.
    from trainyard.client.cli import cost_text, moment

    assert cost_text({"cost": "0.354167", "currency": "USD"}) == "0.35 USD"
    assert cost_text({"cost": "1.005", "currency": "EUR", "projected_cost": "12.499"}) == "1.01 EUR, projected 12.50"
    assert cost_text({"cost": None}) is None
    assert moment("2026-12-05T12:30:01.123456Z") == "2026-12-05 12:30:01 UTC"
    assert moment("2026-12-05T13:30:01+01:00") == "2026-12-05 12:30:01 UTC"
    assert moment("not a time") == "not a time" and moment(None) is None
