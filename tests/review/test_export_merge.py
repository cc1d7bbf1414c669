"""Retrain on reviewed data must not train on the reviewed rows alone.

The default export is the next version of the source job's training dataset: its training
records plus the reviewed ones, a reviewed record already there relabelled, validation
carried over; Retrain keeps the source job's validation channel and drops `tuning:*` tags;
the reviewed-only set stays available as mode reviewed_only. A merge that cannot be done
(the columns differ) is a clear 400."""

from __future__ import annotations

import base64
import csv
import io
import json
import random
from pathlib import Path

import pytest
from PIL import Image

from datasets.actions import VersionOptions, register_local_files
from datasets.models import DatasetVersion, SourceKind, VersionStatus
from datasets.storage import store_for
from datasets.validation_run import run_validation
from review.actions.answers import answer_slot
from review.actions.claims import claim_next_slot
from review.actions.loops import start_loops_for_predictions
from review.errors import ReviewError
from review.export import export_flow
from review.models import HumanLoop

pytestmark = pytest.mark.django_db

FEATURES = ["f1", "f2", "region"]


def ready(version: DatasetVersion) -> DatasetVersion:
    run_validation(version.pk)
    version.refresh_from_db()
    assert version.status == VersionStatus.READY, version.errors
    return version


def read_file(version: DatasetVersion, path: str) -> bytes:
    uri = next(f["uri"] for f in version.files if f["path"] == path)
    with store_for(uri).open_read(uri) as stream:
        return stream.read()


def table(version: DatasetVersion, path: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(read_file(version, path).decode())))


def review_all(flow, users, choose) -> None:
    for user in users:
        while (held := claim_next_slot(user, flow)) is not None:
            loop = HumanLoop.objects.get(pk=held.loop_id)
            answer_slot(held.pk, user, {"label": choose(loop)})


def training_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"f1": f"{rng.random():.4f}", "f2": f"{rng.random():.4f}", "region": rng.choice(["north", "south"]),
             "biome": ["cat", "dog", "bird"][i % 3]} for i in range(count)]


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=[*FEATURES, "biome"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def make_source(project, owner, files: dict[str, Path], *, options: VersionOptions, validation_channel: bool,
                tags: list[str] | None = None, kind: str = "tabular", input_schema: dict | None = None,
                name: str = "animals", algorithm: str = "tabular-classifier", hyperparameters: dict | None = None):
    """A finished job trained on a ready version (train, and validation when asked for),
    registered as model version 1."""
    from hosting.models import Model, ModelVersion
    from jobs.models import JobInput, JobStatus, TrainingJob

    train, _ = register_local_files(project=project, name=name, description="The animals table.", user=owner,
                                    files=files, options=options)
    train = ready(train)
    job = TrainingJob.objects.create(project=project, name=f"{name}-v1", algorithm=algorithm,
                                     status=JobStatus.COMPLETED,
                                     hyperparameters=hyperparameters if hyperparameters is not None
                                     else {"label_column": "biome"},
                                     resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1},
                                     tags=tags or [], created_by=owner)
    JobInput.objects.create(job=job, channel="train", dataset_version=train)
    if validation_channel:
        JobInput.objects.create(job=job, channel="validation", dataset_version=train)
    model = Model.objects.create(project=project, name=name)
    model_version = ModelVersion.objects.create(
        model=model, version=1, job=job, artifact_uri="file:///nowhere", algorithm=algorithm, kind=kind,
        labels=["bird", "cat", "dog"],
        input_schema=input_schema if input_schema is not None else {"label_column": "biome", "columns": FEATURES})
    return job, model_version, train


@pytest.fixture
def animals(project, owner, tmp_path):
    """animals v1: train.csv (60 rows) + validation.csv (40 rows); the job reads both."""
    rows = training_rows(60, 0)
    files = {"train.csv": write_csv(tmp_path / "train.csv", rows),
             "validation.csv": write_csv(tmp_path / "validation.csv", training_rows(40, 9))}
    job, model_version, train = make_source(project, owner, files, options=VersionOptions(format="csv"),
                                            validation_channel=True, tags=["tuning:7", "baseline"])
    return job, model_version, train, rows


def start_reviews(flow, model_version, contents: list[dict], labels: list[str], reviewer) -> None:
    items = [(content, {"label": "cat", "confidence": 0.3, "probabilities": {}}) for content in contents]
    start_loops_for_predictions(flow, items, source={"endpoint": "animals"}, model_version=model_version,
                                        rng=random.Random(2))
    by_content = {json.dumps(c, sort_keys=True): label for c, label in zip(contents, labels, strict=True)}
    review_all(flow, [reviewer], lambda loop: by_content[json.dumps(loop.input_content, sort_keys=True)])


def as_invocation(row: dict) -> dict:
    """What an invocation stores: the model's columns, numbers as numbers."""
    return {"row": {"f1": float(row["f1"]), "f2": float(row["f2"]), "region": row["region"]}}


def relabel(label: str) -> str:
    return {"cat": "dog", "dog": "bird", "bird": "cat"}[label]


@pytest.fixture
def reviewed_animals(make_flow, reviewer, animals):
    """6 reviewed rows: 2 are training rows given another label, 4 are new."""
    job, model_version, train, rows = animals
    flow = make_flow()
    rng = random.Random(5)
    new_rows = [{"row": {"f1": round(rng.random() + 2, 4), "f2": round(rng.random() + 2, 4), "region": "east"}}
                for _ in range(4)]
    contents = [as_invocation(rows[3]), as_invocation(rows[10]), *new_rows]
    labels = [relabel(rows[3]["biome"]), relabel(rows[10]["biome"]), "dog", "dog", "bird", "cat"]
    start_reviews(flow, model_version, contents, labels, reviewer)
    return flow, job, train, rows, labels


def test_the_default_export_is_the_next_version_of_the_training_data_with_the_reviewed_rows_merged(
        reviewed_animals, owner):
    flow, job, train, rows, labels = reviewed_animals
    version = ready(export_flow(flow, owner))
    assert (version.dataset_id, version.version) == (train.dataset_id, 2)  # same dataset, next version
    merged = table(version, "train.csv")
    assert len(merged) == 60 + 4
    assert [r["biome"] for r in merged[:60]] == [
        labels[0] if i == 3 else labels[1] if i == 10 else row["biome"] for i, row in enumerate(rows)]
    assert [r["f1"] for r in merged[:60]] == [r["f1"] for r in rows]  # training rows kept, in order
    assert [(r["region"], r["biome"]) for r in merged[60:]] == [("east", "dog"), ("east", "dog"), ("east", "bird"),
                                                                ("east", "cat")]
    assert read_file(version, "validation.csv") == read_file(train, "validation.csv")  # carried unchanged
    assert version.channel_counts == {"train": 64, "validation": 40}
    provenance = version.provenance
    assert provenance["mode"] == "merged" and provenance["flow"] == {"id": flow.pk, "name": flow.name}
    assert provenance["base_version"] == {"id": train.pk, "dataset": "animals", "version": 1}
    assert provenance["source_job"] == {"id": job.pk, "name": job.name}
    assert provenance["counts"] == {"base_records": 60, "reviewed": 6, "added": 4, "relabelled": 2, "confirmed": 0,
                                    "records": 64, "carried": {"validation": 40}}
    assert provenance["summary"] == "60 rows of animals v1 + 6 reviewed, 2 relabelled"
    assert version.source_kind == SourceKind.REVIEW and version.source_uri == f"review://flows/{flow.pk}"


def test_retrain_keeps_the_validation_channel_and_drops_the_tuning_tag(reviewed_animals, owner, client_for):
    from jobs.models import TrainingJob

    flow, job, train, _rows, _labels = reviewed_animals
    client = client_for(owner)
    exported = client.post(f"/api/v1/flow-definitions/{flow.pk}/export/", {}, format="json")
    assert exported.status_code == 201, exported.content
    assert exported.json()["provenance"]["mode"] == "merged"
    version = ready(DatasetVersion.objects.get(pk=exported.json()["id"]))
    response = client.post(f"/api/v1/dataset-versions/{version.pk}/retrain/")
    assert response.status_code == 201, response.content
    clone = TrainingJob.objects.get(pk=response.json()["id"])
    assert {i.channel: i.dataset_version_id for i in clone.inputs.all()} == {"train": version.pk,
                                                                           "validation": train.pk}
    assert "tuning:7" not in clone.tags and clone.tags == ["baseline", "reviewed"]
    validation = response.json()["validation_records"]
    source = client.get(f"/api/v1/jobs/{job.pk}/").json()["validation_records"]
    assert validation == source == {"count": 40, "source": "channel", "few": False}


def test_a_validation_holdout_is_measured_on_at_least_as_many_rows_as_the_source_jobs(
        project, owner, make_flow, reviewer, tmp_path, client_for):
    """A source job without a validation channel held out 10 % of its 300 rows (30); the
    retrained job on the merged version holds out 10 % of 304 — not 1 of the 6 reviewed."""
    rows = training_rows(300, 1)
    job, model_version, train = make_source(project, owner, {"train.csv": write_csv(tmp_path / "t.csv", rows)},
                                            options=VersionOptions(format="csv"), validation_channel=False)
    flow = make_flow()
    contents = [as_invocation(rows[0]), *[{"row": {"f1": 5.0 + i, "f2": 1.0, "region": "west"}} for i in range(5)]]
    start_reviews(flow, model_version, contents, ["bird" if rows[0]["biome"] != "bird" else "cat", *["cat"] * 5],
                  reviewer)
    client = client_for(owner)
    version = ready(export_flow(flow, owner))
    assert version.num_records == 305
    clone = client.post(f"/api/v1/dataset-versions/{version.pk}/retrain/").json()
    source = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert source["validation_records"] == {"count": 30, "source": "held_out", "few": False}
    assert clone["validation_records"]["count"] == 30 >= source["validation_records"]["count"]
    # The reviewed-only set: the 6 rows alone, a holdout of 1 — flagged as too few.
    only = ready(export_flow(flow, owner, mode="reviewed_only"))
    assert only.num_records == 6 and only.dataset.name == f"{flow.name}-reviewed"
    assert only.provenance["mode"] == "reviewed_only"
    small = client.post(f"/api/v1/dataset-versions/{only.pk}/retrain/").json()
    assert small["validation_records"] == {"count": 1, "source": "held_out", "few": True}


def test_the_preview_says_what_the_new_version_holds(reviewed_animals, owner, viewer, client_for):
    flow, _job, train, _rows, _labels = reviewed_animals
    client = client_for(owner)
    before = DatasetVersion.objects.count()
    body = client.get(f"/api/v1/flow-definitions/{flow.pk}/export/preview/").json()
    assert DatasetVersion.objects.count() == before  # nothing written
    assert body["mode"] == "merged" and body["dataset"] == "animals" and body["next_version"] == 2
    assert body["summary"] == "60 rows of animals v1 + 6 reviewed, 2 relabelled"
    assert body["confirm"] == ("Create animals v2: 60 rows of animals v1 + 6 reviewed, 2 relabelled — 64 training "
                               "records in all (4 added); validation (40) kept as is?")
    assert body["modes"]["merged"] == {"available": True,
                                       "base_version": {"id": train.pk, "dataset": "animals", "version": 1}}
    only = client.get(f"/api/v1/flow-definitions/{flow.pk}/export/preview/?mode=reviewed_only").json()
    assert only["summary"] == "6 reviewed rows only, not merged with the training data"
    assert only["dataset"] == f"{flow.name}-reviewed" and only["next_version"] == 1
    bad = client.get(f"/api/v1/flow-definitions/{flow.pk}/export/preview/?mode=everything")
    assert bad.status_code == 400 and "mode" in bad.json()["error"]["fields"]
    assert client_for(viewer).get(f"/api/v1/flow-definitions/{flow.pk}/export/preview/").status_code == 403


def test_reviewed_only_stays_available_through_the_api(reviewed_animals, owner, client_for):
    flow, *_ = reviewed_animals
    response = client_for(owner).post(f"/api/v1/flow-definitions/{flow.pk}/export/",
                                      {"mode": "reviewed_only", "dataset": "just-reviewed"}, format="json")
    assert response.status_code == 201, response.content
    version = ready(DatasetVersion.objects.get(pk=response.json()["id"]))
    assert version.dataset.name == "just-reviewed" and version.num_records == 6
    # A dataset name with a merge is a clear error: the merge goes to the training dataset.
    clash = client_for(owner).post(f"/api/v1/flow-definitions/{flow.pk}/export/", {"dataset": "other"}, format="json")
    assert clash.status_code == 400 and "dataset" in clash.json()["error"]["fields"]


def test_columns_that_differ_from_the_training_data_cannot_be_merged(animals, make_flow, reviewer, owner, client_for):
    _job, model_version, _train, _rows = animals
    flow = make_flow()
    start_reviews(flow, model_version, [{"row": {"f1": 1.0, "weight": 3}}], ["cat"], reviewer)
    response = client_for(owner).post(f"/api/v1/flow-definitions/{flow.pk}/export/", {}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "mode" in error["fields"]
    assert "columns differ from animals v1's (missing f2, region; not in the training data: weight" in error["message"]
    assert "reviewed_only" in error["message"]
    assert not DatasetVersion.objects.filter(dataset__name="animals", version=2).exists()


def test_reviewing_nothing_new_is_refused(animals, make_flow, reviewer, owner):
    _job, model_version, _train, rows = animals
    flow = make_flow()
    start_reviews(flow, model_version, [as_invocation(rows[0])], [rows[0]["biome"]], reviewer)
    with pytest.raises(ReviewError, match="Nothing to change"):
        export_flow(flow, owner)


def test_loops_from_no_model_export_the_reviewed_rows_and_refuse_a_merge(make_flow, make_loops, reviewer, owner):
    flow = make_flow()
    make_loops(flow, 3, content=lambda i: {"row": {"f1": i}})
    review_all(flow, [reviewer], lambda loop: "cat")
    with pytest.raises(ReviewError, match="did not come from a registered model's job"):
        export_flow(flow, owner, mode="merged")
    version = ready(export_flow(flow, owner))
    assert version.num_records == 3 and version.provenance["mode"] == "reviewed_only"


def test_a_split_version_is_merged_per_channel(project, owner, make_flow, reviewer, tmp_path):
    """A version split by seed: the train part gets the reviews, the validation part is
    carried over as its own files, and the new version needs no split."""
    rows = training_rows(80, 3)
    job, model_version, train = make_source(
        project, owner, {"all.csv": write_csv(tmp_path / "all.csv", rows)},
        options=VersionOptions(format="csv", split={"train": 0.75, "validation": 0.25, "seed": 4}),
        validation_channel=True)
    train_count = train.channel_counts["train"]
    flow = make_flow()
    start_reviews(flow, model_version, [{"row": {"f1": 9.5, "f2": 9.5, "region": "north"}}], ["bird"], reviewer)
    version = ready(export_flow(flow, owner))
    assert version.split == {}
    assert version.channel_counts == {"train": train_count + 1, "validation": train.channel_counts["validation"]}
    assert sorted(f["path"] for f in version.files) == ["train/all.csv", "validation/all.csv"]
    assert table(version, "train/all.csv")[-1] == {"f1": "9.5", "f2": "9.5", "region": "north", "biome": "bird"}


def test_jsonl_texts_are_matched_on_the_text(project, owner, make_flow, reviewer, tmp_path):
    path = tmp_path / "train.jsonl"
    records = [{"text": f"sentence {i}", "label": ["cat", "dog"][i % 2], "id": i} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    _job, model_version, _train = make_source(
        project, owner, {"train.jsonl": path}, options=VersionOptions(format="jsonl", label_column="label"),
        validation_channel=False, kind="text", input_schema={"text_column": "text", "label_column": "label"},
        name="sentences", algorithm="text-classifier", hyperparameters={})
    flow = make_flow()
    start_reviews(flow, model_version, [{"text": "sentence 2"}, {"text": "a new one"}], ["bird", "dog"], reviewer)
    version = ready(export_flow(flow, owner))
    lines = [json.loads(x) for x in read_file(version, "train.jsonl").decode().splitlines()]
    assert len(lines) == 11 and lines[2] == {"text": "sentence 2", "label": "bird", "id": 2}
    assert lines[-1] == {"text": "a new one", "label": "dog"}
    assert version.provenance["summary"] == "10 records of sentences v1 + 2 reviewed, 1 relabelled"


def png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_images_are_matched_on_their_bytes_and_move_to_the_human_label(project, owner, make_flow, reviewer,
                                                                        tmp_path):
    files = {}
    for index, (channel, label) in enumerate([("train", "cat"), ("train", "cat"), ("train", "dog"),
                                              ("validation", "dog"), ("validation", "cat")]):
        path = tmp_path / f"{index}.png"
        path.write_bytes(png((index * 40, 10, 10)))
        files[f"{channel}/{label}/{index}.png"] = path
    _job, model_version, _train = make_source(
        project, owner, files, options=VersionOptions(format="image_folder"), validation_channel=True, kind="image",
        input_schema={}, name="pictures", algorithm="image-classifier", hyperparameters={})
    flow = make_flow()
    contents = [{"image": base64.b64encode(png((40, 10, 10))).decode(), "media_type": "image/png"},
                {"image": base64.b64encode(png((250, 250, 250))).decode(), "media_type": "image/png"}]
    start_reviews(flow, model_version, contents, ["bird", "dog"], reviewer)
    version = ready(export_flow(flow, owner))
    paths = sorted(f["path"] for f in version.files)
    assert "train/bird/1.png" in paths and "train/cat/1.png" not in paths
    assert sum(p.startswith("train/dog/reviewed-") for p in paths) == 1
    assert [p for p in paths if p.startswith("validation/")] == ["validation/cat/4.png", "validation/dog/3.png"]
    assert version.channel_counts == {"train": 4, "validation": 2}
    assert version.provenance["summary"] == "3 images of pictures v1 + 2 reviewed, 1 relabelled"


def test_plain_text_training_data_cannot_take_labels(project, owner, make_flow, reviewer, tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("one line\nanother line\n")
    _job, model_version, _train = make_source(project, owner, {"train.txt": path}, options=VersionOptions(format="text"),
                                              validation_channel=False, kind="text", input_schema={}, name="prose",
                                              algorithm="text-classifier", hyperparameters={})
    flow = make_flow()
    start_reviews(flow, model_version, [{"text": "one line"}], ["cat"], reviewer)
    with pytest.raises(ReviewError, match="plain text without labels"):
        export_flow(flow, owner)
    assert ready(export_flow(flow, owner, mode="reviewed_only")).num_records == 1


# --- pages ------------------------------------------------------------------------------------
def signed_in(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_the_flow_page_offers_both_exports_and_the_retrain_says_what_it_trains_and_validates_on(
        reviewed_animals, owner):
    import html

    flow, job, train, _rows, _labels = reviewed_animals
    client = signed_in(owner)
    page = client.get(f"/review/flows/{flow.pk}/").content.decode()
    assert 'name="mode" value="merged" checked' in page and 'name="mode" value="reviewed_only"' in page
    assert f'data-preview-url="/api/v1/flow-definitions/{flow.pk}/export/preview/"' in page
    response = client.post(f"/review/flows/{flow.pk}/export/", {"mode": "merged", "confirmed": "1"})
    version = DatasetVersion.objects.get(dataset=train.dataset, version=2)
    assert response.status_code == 302 and response["Location"].endswith(f"?exported={version.pk}#exports")
    ready(version)
    page = html.unescape(client.get(f"/review/flows/{flow.pk}/").content.decode())
    assert "60 rows of animals v1 + 6 reviewed, 2 relabelled" in page
    assert (f'data-confirm="Start a training job: a clone of {job.name}, trained on animals v2 (60 rows of animals v1 '
            '+ 6 reviewed, 2 relabelled), validated on animals v1 as before (40 records)?"') in page
    response = client.post(f"/review/flows/{flow.pk}/export/", {"mode": "reviewed_only", "confirmed": "1"})
    assert DatasetVersion.objects.get(dataset__name=f"{flow.name}-reviewed").num_records is None  # validating
    again = client.post(f"/review/flows/{flow.pk}/export/", {"mode": "merged", "confirmed": "1"}, follow=True).content.decode()
    assert "Nothing new: animals v2 already holds exactly this export" in html.unescape(again)


def test_the_job_page_warns_when_validation_has_fewer_than_30_records(project, owner, tmp_path):
    from jobs.models import TrainingJob

    small, _mv, _train = make_source(project, owner, {"train.csv": write_csv(tmp_path / "s.csv", training_rows(50, 2))},
                                     options=VersionOptions(format="csv"), validation_channel=False, name="small")
    big, _mv2, _t2 = make_source(project, owner, {"train.csv": write_csv(tmp_path / "b.csv", training_rows(400, 3))},
                                 options=VersionOptions(format="csv"), validation_channel=False, name="big")
    TrainingJob.objects.filter(pk__in=[small.pk, big.pk]).update(final_metrics={"validation_accuracy": 1.0})
    client = signed_in(owner)
    page = client.get(f"/jobs/{small.pk}/").content.decode()
    assert 'id="validation-size-warning"' in page
    assert "Validation is measured on only 5 records (held out of the training data" in page
    assert 'id="validation-size-warning"' not in client.get(f"/jobs/{big.pk}/").content.decode()


def test_the_clone_form_does_not_carry_a_tuning_tag(animals, owner):
    job, *_ = animals
    form = signed_in(owner).get(f"/jobs/new/?clone={job.pk}").context["form"]
    assert form.initial["tags"] == "baseline"


def test_the_same_export_twice_says_nothing_new_was_made(reviewed_animals, owner, client_for):
    flow, *_ = reviewed_animals
    client = client_for(owner)
    first = client.post(f"/api/v1/flow-definitions/{flow.pk}/export/", {}, format="json")
    assert first.status_code == 201 and first.json()["version"] == 2
    again = client.post(f"/api/v1/flow-definitions/{flow.pk}/export/", {}, format="json")
    assert again.status_code == 200, again.content
    body = again.json()
    assert (body["id"], body["unchanged"]) == (first.json()["id"], True)
    assert body["reason"] == "animals v2 already holds exactly this export; no new version was made."
    assert body["provenance"]["counts"]["relabelled"] == 2
