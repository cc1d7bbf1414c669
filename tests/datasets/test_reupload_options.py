"""The same files registered with other reading options (label column,
delimiter, split, format, text column) are a new version; only the same files with the
same options return the existing one, and then the answer says plainly that nothing
changed and why. A version in which no label column was found says so on its page."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from datasets.models import DatasetVersion
from datasets.validation_run import run_validation

FLOWERS = b"length,width,species,colour\n1.4,0.2,setosa,red\n4.7,1.4,versicolor,blue\n6.0,2.5,virginica,red\n1.3,0.2,setosa,blue\n"
SEMICOLONS = b"a;b;label\n1;2;x\n3;4;y\n5;6;x\n"
NO_LABEL = b"height,weight,age\n180,75,31\n165,60,45\n172,68,28\n"


def upload(client, content: bytes = FLOWERS, name: str = "flowers", file_name: str = "train.csv", **fields):
    data = {"project": "acme", "name": name, **fields,
            "file": [SimpleUploadedFile(file_name, content, content_type="text/csv")]}
    return client.post("/api/v1/datasets/", data, format="multipart")


def test_same_file_with_another_label_column_is_a_new_version(owner, client_for):
    client = client_for(owner)
    first = upload(client, label_column="species")
    assert first.status_code == 201, first.content
    assert run_validation(first.json()["id"]) == "ready"
    second = upload(client, label_column="colour")
    assert second.status_code == 201, second.content  # before the fix: 200 and v1 again
    body = second.json()
    assert body["version"] == 2 and body["created"] is True and body["unchanged"] is False
    assert body["label_column"] == "colour"
    assert run_validation(body["id"]) == "ready"
    version = DatasetVersion.objects.get(pk=body["id"])
    assert version.schema["label_column"] == "colour"
    assert set(version.schema["classes"]) == {"red", "blue"}
    assert DatasetVersion.objects.get(pk=first.json()["id"]).schema["label_column"] == "species"


@pytest.mark.parametrize("first_options, second_options", [
    ({"delimiter": ","}, {"delimiter": ";"}),
    ({}, {"split": json.dumps({"train": 0.5, "validation": 0.5, "seed": 1})}),
    ({"split": json.dumps({"train": 0.5, "validation": 0.5, "seed": 1})},
     {"split": json.dumps({"train": 0.5, "validation": 0.5, "seed": 2})}),
    ({}, {"format": "csv"}),
    ({}, {"text_column": "b"}),
], ids=["delimiter", "split-added", "split-seed", "format", "text-column"])
def test_any_reading_option_changed_is_a_new_version(owner, client_for, first_options, second_options):
    client = client_for(owner)
    first = upload(client, SEMICOLONS, name="semi", **first_options)
    assert first.status_code == 201, first.content
    second = upload(client, SEMICOLONS, name="semi", **second_options)
    assert second.status_code == 201, second.content
    assert second.json()["version"] == 2
    assert second.json()["requested_options"] != first.json()["requested_options"]


def test_a_new_delimiter_reads_the_records_differently(owner, client_for):
    both = b"a;b,label\n1;2,x\n3;4,y\n5;6,x\n"  # two columns read with ',' and with ';'
    client = client_for(owner)
    comma = upload(client, both, name="semi").json()
    assert run_validation(comma["id"]) == "ready"
    semi = upload(client, both, name="semi", delimiter=";")
    assert semi.status_code == 201, semi.content
    assert run_validation(semi.json()["id"]) == "ready"
    schemas = [DatasetVersion.objects.get(pk=pk).schema for pk in (comma["id"], semi.json()["id"])]
    assert [[c["name"] for c in schema["columns"]] for schema in schemas] == [["a;b", "label"], ["a", "b,label"]]
    assert schemas[0]["label_column"] == "label" and schemas[1]["label_column"] is None


def test_same_file_and_same_options_says_nothing_changed_and_why(owner, client_for):
    client = client_for(owner)
    first = upload(client, label_column="species", delimiter=",")
    assert first.status_code == 201
    run_validation(first.json()["id"])
    again = upload(client, label_column="species", delimiter=",")
    assert again.status_code == 200, again.content
    body = again.json()
    assert body["id"] == first.json()["id"]
    assert body["created"] is False and body["unchanged"] is True
    assert "nothing changed" in body["reason"]
    assert "flowers v1" in body["reason"] and "label column 'species'" in body["reason"]
    assert DatasetVersion.objects.filter(dataset__name="flowers").count() == 1
    fresh = upload(client, label_column="species", delimiter=",", file_name="train.csv",
                   content=FLOWERS + b"5.1,1.8,virginica,blue\n")
    assert fresh.status_code == 201 and fresh.json()["unchanged"] is False and fresh.json()["reason"] is None


def test_server_path_with_another_label_column_is_a_new_version(owner, client_for, data_root):
    folder = data_root / "flowers-reupload-options"
    folder.mkdir()
    (folder / "train.csv").write_bytes(FLOWERS)
    client = client_for(owner)
    payload = {"project": "acme", "name": "flowers-path", "source_uri": folder.as_uri(), "label_column": "species"}
    first = client.post("/api/v1/datasets/", payload, format="json")
    assert first.status_code == 201, first.content
    same = client.post("/api/v1/datasets/", payload, format="json")
    assert same.status_code == 200 and same.json()["unchanged"] is True and same.json()["reason"]
    other = client.post("/api/v1/datasets/", {**payload, "label_column": "colour"}, format="json")
    assert other.status_code == 201, other.content
    assert other.json()["version"] == 2


def test_version_page_says_when_no_label_column_was_found(owner, client_for, client):
    api = client_for(owner)
    unlabelled = upload(api, NO_LABEL, name="people")
    assert run_validation(unlabelled.json()["id"]) == "ready"
    client.force_login(owner)
    page = client.get(f"/datasets/versions/{unlabelled.json()['id']}/", follow=True)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="no-label-notice"' in html
    assert "No label column was found" in html
    labelled = upload(api, FLOWERS, name="flowers", label_column="species")
    run_validation(labelled.json()["id"])
    page = client.get(f"/datasets/versions/{labelled.json()['id']}/", follow=True)
    assert 'id="no-label-notice"' not in page.content.decode()


def test_tab_written_either_way_is_the_same_option(owner, client_for):
    tsv = b"a\tb\tlabel\n1\t2\tx\n3\t4\ty\n"
    client = client_for(owner)
    first = upload(client, tsv, name="tabs", file_name="train.tsv", delimiter="tab")
    assert first.status_code == 201, first.content  # "tab" was refused: longer than 2 characters
    again = upload(client, tsv, name="tabs", file_name="train.tsv", delimiter="\\t")
    assert again.status_code == 200 and again.json()["unchanged"] is True, again.content
    assert "delimiter '\\t'" in again.json()["reason"]


def test_a_version_from_before_requested_options_is_compared_with_how_it_was_read(owner, client_for):
    client = client_for(owner)
    first = upload(client, label_column="species")
    run_validation(first.json()["id"])
    DatasetVersion.objects.filter(pk=first.json()["id"]).update(requested_options={})  # as migrated
    again = upload(client, label_column="species")  # e.g. `studio up` loading the demo again
    assert again.status_code == 200 and again.json()["unchanged"] is True, again.content
    assert "label column 'species'" in again.json()["reason"]
    other = upload(client, label_column="colour")
    assert other.status_code == 201 and other.json()["version"] == 2


def test_the_demo_loads_once(project, owner):
    from datasets.demo import load_demo_data

    first = load_demo_data(project, owner)
    again = load_demo_data(project, owner)
    assert [v.pk for v in again] == [v.pk for v in first]
    assert all(v.version == 1 for v in again)
    DatasetVersion.objects.update(requested_options={})  # an install from before the field
    assert [v.pk for v in load_demo_data(project, owner)] == [v.pk for v in first]
