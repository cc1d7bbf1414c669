"""Back into training: completed loops become a ready DatasetVersion with the human
labels, in the format of their content; Retrain clones the source job onto it."""

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
from review.consolidation import NO_CONSENSUS
from review.errors import ReviewError
from review.export import export_flow
from review.models import HumanLoop

pytestmark = pytest.mark.django_db


def review_all(flow, users, choose) -> None:
    """Each user answers every slot they can get: choose(loop) gives the label."""
    for user in users:
        while (held := claim_next_slot(user, flow)) is not None:
            loop = HumanLoop.objects.get(pk=held.loop_id)
            answer_slot(held.pk, user, {"label": choose(loop)})


def read_file(version: DatasetVersion, path: str) -> bytes:
    uri = next(f["uri"] for f in version.files if f["path"] == path)
    with store_for(uri).open_read(uri) as stream:
        return stream.read()


def ready(version: DatasetVersion) -> DatasetVersion:
    run_validation(version.pk)
    version.refresh_from_db()
    assert version.status == VersionStatus.READY, version.errors
    return version


def human_label(index: int) -> str:
    return ["dog", "bird", "dog"][index % 3]


def test_export_of_rows_is_a_ready_csv_with_the_consolidated_labels(make_flow, make_loops, reviewer, owner):
    flow = make_flow()
    rows = [{"f1": i, "f2": i * 0.5, "region": "north" if i % 2 else "south"} for i in range(9)]
    loops = make_loops(flow, 9, content=lambda i: {"row": rows[i]}, labels=lambda i: "cat")
    review_all(flow, [reviewer], lambda loop: human_label(int(loop.input_content["row"]["f1"])))
    version = ready(export_flow(flow, owner))
    assert version.dataset.name == f"{flow.name}-reviewed" and version.format == "csv"
    assert (version.source_kind, version.source_uri) == (SourceKind.REVIEW, f"review://flows/{flow.pk}")
    assert version.num_records == 9
    table = list(csv.DictReader(io.StringIO(read_file(version, "reviewed.csv").decode())))
    assert [r["label"] for r in table] == [human_label(i) for i in range(9)]
    assert [r["f1"] for r in table] == [str(i) for i in range(9)] and set(table[0]) == {"f1", "f2", "region", "label"}
    assert [r["label"] for r in table] == list(
        HumanLoop.objects.filter(pk__in=[x.pk for x in loops]).order_by("created_at", "id")
        .values_list("consolidated_label", flat=True))
    assert (version.schema or {}).get("label_column") == "label"


def test_export_of_texts_is_jsonl_and_skips_no_consensus(make_flow, make_loops, owner, reviewers, team):
    users = reviewers(4)
    flow = make_flow(task_count=2, labels=["cat", "dog", "bird", "fish"], work_team=team(owner, *users))
    agreed, tied = make_loops(flow, 2, content=lambda i: {"text": f"sentence {i}"})
    for user, label in zip(users[:2], ["cat", "cat"], strict=True):
        held = claim_next_slot(user, flow)
        assert held.loop_id == agreed.pk
        answer_slot(held.pk, user, {"label": label})
    for user, label in zip(users, ["cat", "dog", "bird", "fish"], strict=True):
        held = claim_next_slot(user, flow)
        assert held.loop_id == tied.pk
        answer_slot(held.pk, user, {"label": label})
    assert HumanLoop.objects.get(pk=tied.pk).consolidated_label == NO_CONSENSUS
    version = ready(export_flow(flow, owner, "reviewed-texts"))
    assert version.dataset.name == "reviewed-texts" and version.format == "jsonl"
    records = [json.loads(line) for line in read_file(version, "reviewed.jsonl").decode().splitlines()]
    assert records == [{"text": "sentence 0", "label": "cat"}]


def png(color: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_export_of_images_is_an_image_folder_by_label(make_flow, make_loops, reviewer, owner):
    flow = make_flow()
    make_loops(flow, 4, content=lambda i: {"image": png((i * 40, 0, 0)), "media_type": "image/png"})
    review_all(flow, [reviewer], lambda loop: "cat" if loop.input_content["image"] in (png((0, 0, 0)), png((80, 0, 0)))
               else "dog")
    version = ready(export_flow(flow, owner))
    assert version.format == "image_folder"
    assert sorted(f["path"].split("/")[0] for f in version.files) == ["cat", "cat", "dog", "dog"]
    assert all(f["path"].endswith(".png") for f in version.files)


def test_nothing_to_export_and_free_text_are_refused(make_flow, make_loops, owner, reviewer):
    flow = make_flow()
    make_loops(flow, 2)
    with pytest.raises(ReviewError, match="Nothing to export"):
        export_flow(flow, owner)
    notes = make_flow(task_type="free_text")
    with pytest.raises(ReviewError, match="free_text flows have no labels to export"):
        export_flow(notes, owner)


def test_export_api_returns_the_new_version_and_is_for_writers(client_for, make_flow, make_loops, reviewer, owner,
                                                               viewer):
    flow = make_flow()
    make_loops(flow, 2)
    client = client_for(owner)
    empty = client.post(f"/api/v1/flow-definitions/{flow.pk}/export/", {}, format="json")
    assert empty.status_code == 400 and "flow_definition" in empty.json()["error"]["fields"]
    review_all(flow, [reviewer], lambda loop: "bird")
    assert client_for(viewer).post(f"/api/v1/flow-definitions/{flow.pk}/export/", {},
                                   format="json").status_code == 403
    response = client.post(f"/api/v1/flow-definitions/{flow.pk}/export/", {"dataset": "birds"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "birds" and body["status"] == "validating"
    assert ready(DatasetVersion.objects.get(pk=body["id"])).num_records == 2


# --- retrain ------------------------------------------------------------------------------
@pytest.fixture
def source_job(project, owner, tmp_path):
    """A finished tabular job trained on a ready CSV, registered as model version 1."""
    from hosting.models import Model, ModelVersion
    from jobs.models import JobInput, JobStatus, TrainingJob

    rng = random.Random(0)
    path = Path(tmp_path) / "train.csv"
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["f1", "f2", "biome"])
        for i in range(30):
            writer.writerow([rng.random(), rng.random(), ["cat", "dog", "bird"][i % 3]])
    train, _ = register_local_files(project=project, name="animals", description="", user=owner,
                                    files={"train.csv": path}, options=VersionOptions(format="csv",
                                                                                       label_column="biome"))
    run_validation(train.pk)
    job = TrainingJob.objects.create(project=project, name="animals-v1", algorithm="tabular-classifier",
                                     status=JobStatus.COMPLETED, hyperparameters={"label_column": "biome"},
                                     resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1},
                                     created_by=owner)
    JobInput.objects.create(job=job, channel="train", dataset_version=train)
    model = Model.objects.create(project=project, name="animals")
    version = ModelVersion.objects.create(model=model, version=1, job=job, artifact_uri="file:///nowhere",
                                          algorithm="tabular-classifier", kind="tabular", labels=["bird", "cat", "dog"],
                                          input_schema={"label_column": "biome", "columns": ["f1", "f2"]})
    return job, version


def test_retrain_clones_the_source_job_onto_the_reviewed_only_version(make_flow, reviewer, owner, source_job,
                                                                      client_for):
    job, model_version = source_job
    flow = make_flow()
    rng = random.Random(1)
    items = [({"row": {"f1": rng.random(), "f2": rng.random()}}, {"label": "cat", "confidence": 0.3,
                                                                 "probabilities": {}}) for _ in range(6)]
    start_loops_for_predictions(flow, items, source={"endpoint": "animals"}, model_version=model_version,
                                        rng=random.Random(2))
    review_all(flow, [reviewer], lambda loop: "dog" if loop.input_content["row"]["f1"] < 0.5 else "bird")
    exported = ready(export_flow(flow, owner, mode="reviewed_only"))
    header = read_file(exported, "reviewed.csv").decode().splitlines()[0]
    assert header == "f1,f2,biome"  # the label column the model was trained with
    response = client_for(owner).post(f"/api/v1/dataset-versions/{exported.pk}/retrain/")
    assert response.status_code == 201, response.content
    from jobs.models import TrainingJob

    clone = TrainingJob.objects.get(pk=response.json()["id"])
    assert clone.pk != job.pk and clone.algorithm == job.algorithm and clone.status == "Pending"
    assert {i.channel: i.dataset_version_id for i in clone.inputs.all()} == {"train": exported.pk}
    assert clone.hyperparameters["label_column"] == "biome"


def test_the_default_export_and_retrain_train_on_the_training_rows_plus_the_reviewed_ones(
        make_flow, reviewer, owner, source_job, client_for):
    """Not the 6 reviewed rows alone (a holdout of 1 row, validation_accuracy 1),
    but animals v1's 30 rows + 6 reviewed, as animals v2; a reviewed training row is relabelled."""
    job, model_version = source_job
    train = job.inputs.get(channel="train").dataset_version
    first = next(csv.DictReader(io.StringIO(read_file(train, "train.csv").decode())))
    flow = make_flow()
    rng = random.Random(1)
    rows = [{"f1": float(first["f1"]), "f2": float(first["f2"])}] + [
        {"f1": rng.random() + 5, "f2": rng.random()} for _ in range(5)]
    start_loops_for_predictions(flow, [({"row": row}, {"label": "cat", "confidence": 0.3}) for row in rows],
                                        source={"endpoint": "animals"}, model_version=model_version,
                                        rng=random.Random(2))
    review_all(flow, [reviewer], lambda loop: "dog")
    exported = ready(export_flow(flow, owner))
    assert (exported.dataset_id, exported.version, exported.num_records) == (train.dataset_id, 2, 35)
    merged = list(csv.DictReader(io.StringIO(read_file(exported, "train.csv").decode())))
    assert merged[0] == {**first, "biome": "dog"} and first["biome"] == "cat"  # relabelled in place
    assert exported.provenance["summary"] == "30 rows of animals v1 + 6 reviewed, 1 relabelled"
    response = client_for(owner).post(f"/api/v1/dataset-versions/{exported.pk}/retrain/")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["inputs"]["train"]["dataset_version"] == exported.pk
    assert body["validation_records"]["count"] == 4 >= 3  # 10 % of 35 rows; the source job held out 3 of 30


def test_retrain_needs_a_reviewed_version_with_a_source_job(make_flow, reviewer, owner, client_for, source_job):
    flow = make_flow()
    from tests.review.conftest import LABELS  # noqa: F401  (the flow's labels)

    start_loops_for_predictions(flow, [({"text": "t"}, {"label": "cat", "confidence": 0.1})],
                                        source={}, rng=random.Random(0))
    review_all(flow, [reviewer], lambda loop: "cat")
    exported = ready(export_flow(flow, owner))
    response = client_for(owner).post(f"/api/v1/dataset-versions/{exported.pk}/retrain/")
    assert response.status_code == 400 and "source job" in response.json()["error"]["message"]
    plain = DatasetVersion.objects.exclude(source_kind=SourceKind.REVIEW).first()
    response = client_for(owner).post(f"/api/v1/dataset-versions/{plain.pk}/retrain/")
    assert response.status_code == 400 and "dataset_version" in response.json()["error"]["fields"]
    assert client_for(reviewer).post(f"/api/v1/dataset-versions/{exported.pk}/retrain/").status_code == 404
