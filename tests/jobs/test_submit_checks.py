"""A built-in algorithm is given only data it can train on. Submit checks
each channel's dataset version against the algorithm (format, label column, text column,
classes, the files it reads) and answers 400 naming the channel (`inputs.train`) and why,
instead of a job that fails seconds after it starts. A script job is not restricted, and a
tuning job's base job gets the same check."""

from __future__ import annotations

import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image

from algorithms import ALGORITHMS
from algorithms.base import IMAGE_FILES, LABEL_NAMES, TABLE_FILES, DataFacts, data_problem
from jobs.models import TrainingJob
from tests import factories
from tuning.models import TuningJob

FLOWERS = "length,width,species\n" + "".join(f"{i % 9}.{i % 7},{i % 4}.{i % 3},{('setosa', 'virginica')[i % 2]}\n"
                                            for i in range(40))
LABELLED = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(40))
UNLABELLED = "height,weight,age\n" + "".join(f"{150 + i},{50 + i % 20},{20 + i % 30}\n" for i in range(40))
ONE_CLASS = "a,b,label\n" + "".join(f"{i},{i % 7},same\n" for i in range(40))
ONLY_LABEL = "label\n" + "".join(f"{'xy'[i % 2]}\n" for i in range(40))
REVIEWS = "review,label\n" + "".join(f"\"{('great', 'awful')[i % 2]} film number {i}\",{('pos', 'neg')[i % 2]}\n"
                                     for i in range(40))
PROSE = "".join(f"The quick brown fox {i} jumps over the lazy dog.\n" for i in range(200))


def png(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def make_version(project, owner, tmp_path):
    def make(name: str, files: dict[str, str | bytes], **options) -> int:
        return factories.make_version(project, tmp_path, files, name=name, user=owner, **options).pk

    return make


@pytest.fixture
def versions(make_version) -> dict[str, int]:
    return {
        "labelled": make_version("labelled", {"train.csv": LABELLED}),
        "flowers": make_version("flowers", {"train.csv": FLOWERS}, label_column="species"),
        "unlabelled": make_version("people", {"train.csv": UNLABELLED}),
        "one-class": make_version("one-class", {"train.csv": ONE_CLASS}),
        "only-label": make_version("only-label", {"train.csv": ONLY_LABEL}),
        "reviews": make_version("reviews", {"train.csv": REVIEWS}, text_column="review"),
        "reviews-no-text": make_version("reviews-no-text", {"train.csv": REVIEWS}),
        "prose": make_version("prose", {"train.txt": PROSE}),
        "shapes": make_version("shapes", {f"{kind}/{i}.png": png(colour) for kind, colour in
                                          (("red", (250, 0, 0)), ("blue", (0, 0, 250))) for i in range(3)}),
        "csv-in-txt": make_version("csv-in-txt", {"train.txt": LABELLED}, format="csv"),
    }


def submit(client, algorithm: str, inputs: dict, **hyperparameters):
    body = {"project": "acme", "name": "check", "algorithm": algorithm, "hyperparameters": {"epochs": 1, **hyperparameters},
            "inputs": inputs}
    return client.post("/api/v1/jobs/", body, format="json")


REFUSED = [
    ("tabular-classifier", "prose", {}, "inputs.train", "prose v1 is plain text; tabular-classifier reads CSV or JSON Lines"),
    ("tabular-classifier", "shapes", {}, "inputs.train", "image folders"),
    ("tabular-classifier", "unlabelled", {}, "inputs.train", "people v1 has no label column"),
    ("tabular-classifier", "labelled", {"label_column": "nope"}, "inputs.train", "no column 'nope' (label_column)"),
    ("tabular-classifier", "one-class", {}, "inputs.train", "only 'same'"),
    ("tabular-classifier", "only-label", {}, "inputs.train", "no feature columns"),
    ("tabular-classifier", "csv-in-txt", {}, "inputs.train", "has only .txt files"),
    ("text-classifier", "reviews-no-text", {}, "inputs.train", "no column 'text' (text_column)"),
    ("text-classifier", "unlabelled", {"text_column": "age"}, "inputs.train", "no label column"),
    ("text-classifier", "prose", {}, "inputs.train", "plain text"),
    ("char-lm", "labelled", {}, "inputs.train", "labelled v1 is CSV; char-lm reads plain text"),
    ("char-lm", "shapes", {}, "inputs.train", "char-lm reads plain text"),
    ("image-classifier", "labelled", {}, "inputs.train", "image-classifier reads image folders"),
    ("image-classifier", "prose", {}, "inputs.train", "image folders"),
]


@pytest.mark.parametrize(("algorithm", "data", "hyperparameters", "field", "text"), REFUSED,
                         ids=[f"{a}-{d}-{'-'.join(h) or 'defaults'}" for a, d, h, _, _ in REFUSED])
def test_data_the_algorithm_cannot_use_is_a_400_naming_the_channel(owner, client_for, versions, algorithm, data,
                                                                    hyperparameters, field, text):
    response = submit(client_for(owner), algorithm, {"train": {"dataset_version": versions[data]}}, **hyperparameters)
    assert response.status_code == 400, response.content  # before the fix: 201, and the job failed once started
    error = response.json()["error"]
    assert field in error["fields"], error
    assert text in " ".join(error["fields"][field]), error
    assert not TrainingJob.objects.exists()


ACCEPTED = [
    ("tabular-classifier", "labelled", {}, {"label_column": "label"}),
    ("tabular-classifier", "flowers", {}, {"label_column": "species"}),
    ("tabular-classifier", "unlabelled", {"label_column": "age"}, {"label_column": "age"}),
    ("text-classifier", "reviews", {}, {"text_column": "review", "label_column": "label"}),
    ("text-classifier", "reviews-no-text", {"text_column": "review"}, {"text_column": "review"}),
    ("char-lm", "prose", {}, {}),
    ("image-classifier", "shapes", {}, {}),
]


@pytest.mark.parametrize(("algorithm", "data", "hyperparameters", "expected"), ACCEPTED,
                         ids=[f"{a}-{d}" for a, d, _, _ in ACCEPTED])
def test_data_that_fits_is_accepted(owner, client_for, versions, algorithm, data, hyperparameters, expected):
    response = submit(client_for(owner), algorithm, {"train": {"dataset_version": versions[data]}}, **hyperparameters)
    assert response.status_code == 201, response.content
    assert expected.items() <= response.json()["hyperparameters"].items()


def test_a_forced_format_read_by_extension_is_fine_when_streamed(owner, client_for, versions):
    # Streamed, the records come through the manifest with the version's format; the
    # channel folder's file names do not matter.
    client = client_for(owner)
    streamed = submit(client, "tabular-classifier", {"train": {"dataset_version": versions["csv-in-txt"], "mode": "stream"}})
    assert streamed.status_code == 201, streamed.content


def test_every_channel_is_checked_and_named(owner, client_for, versions):
    response = submit(client_for(owner), "tabular-classifier", {
        "train": {"dataset_version": versions["labelled"]},
        "validation": {"dataset_version": versions["unlabelled"]},
        "test": {"dataset_version": versions["prose"]},
    })
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert "inputs.train" not in fields
    assert "no column 'label' (label_column)" in fields["inputs.validation"][0]
    assert "plain text" in fields["inputs.test"][0]


def test_without_train_only_the_missing_channel_is_named(owner, client_for, versions):
    response = submit(client_for(owner), "tabular-classifier", {"validation": {"dataset_version": versions["labelled"]}})
    assert response.status_code == 400, response.content
    assert set(response.json()["error"]["fields"]) == {"inputs"}


def test_a_script_job_may_read_any_data(owner, client_for, versions):
    client = client_for(owner)
    script = client.post("/api/v1/scripts/", {"project": "acme", "file": SimpleUploadedFile("train.py", b"print(1)\n")},
                         format="multipart").json()
    body = {"project": "acme", "name": "mine", "script": {"uri": script["uri"], "entry_point": "train.py"},
            "inputs": {"train": versions["prose"], "images": versions["shapes"], "table": versions["unlabelled"]}}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content


def test_a_tuning_job_base_job_gets_the_same_check(owner, client_for, versions):
    body = {"project": "acme", "name": "search", "strategy": "random", "max_trials": 2, "max_parallel": 1,
            "base_job": {"algorithm": "tabular-classifier", "hyperparameters": {"epochs": 1},
                         "inputs": {"train": {"dataset_version": versions["unlabelled"]}}},
            "parameter_ranges": {"learning_rate": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"}}}
    response = client_for(owner).post("/api/v1/tuning-jobs/", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert "no label column" in str(fields["base_job.inputs.train"]), fields
    assert not TuningJob.objects.exists() and not TrainingJob.objects.exists()
    body["base_job"]["inputs"]["train"]["dataset_version"] = versions["labelled"]
    assert client_for(owner).post("/api/v1/tuning-jobs/", body, format="json").status_code == 201


def test_the_declaration_matches_what_the_algorithms_read():
    from algorithms import channels, image

    assert TABLE_FILES == channels.TABLE_EXTENSIONS
    assert IMAGE_FILES == image.IMAGE_EXTENSIONS
    assert LABEL_NAMES == channels.LABEL_NAMES
    for spec in ALGORITHMS.values():
        described = spec.as_json()
        assert described["accepts"]["extensions"], spec.name
        assert set(described["formats"]) == set(spec.formats)


def test_the_check_is_plain_data_in_and_a_sentence_out():
    tabular = ALGORITHMS["tabular-classifier"]
    facts = DataFacts(name="iris v3", format="csv", columns=("a", "b", "kind"), label_column="", classes=None,
                      extensions=(".csv",))
    assert "iris v3 has no label column" in data_problem(tabular, "train", facts, {"label_column": ""})
    assert data_problem(tabular, "train", facts, {"label_column": "kind"}) is None
    assert data_problem(ALGORITHMS["char-lm"], "train", facts, {}) == "iris v3 is CSV; char-lm reads plain text."


def test_a_bad_hyperparameter_is_named_once(client_for, owner, project):
    response = client_for(owner).post("/api/v1/jobs/", {"project": project.slug, "name": "x", "algorithm": "tabular-classifier",
                                                        "hyperparameters": {"epochs": 0}}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["fields"]["hyperparameters.epochs"] == ["must be ≥ 1, got 0"]
    assert "epochs: epochs" not in error["message"]
