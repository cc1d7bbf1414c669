"""image-classifier, text-classifier and char-lm learn their kind of data, write model/,
and predict (or generate) from it. In-process runs on small data; see test_algorithms.py
for the launcher, DDP, resume and failure tests common to all of them."""

from __future__ import annotations

import base64
import json
import random

import pytest

from tests.algorithms.test_algorithms import JobDir, assert_ok, run_in_process


# --- image-classifier ----------------------------------------------------------------------
def write_shapes(folder, per_class: int, seed: int, prefix: str = "") -> list:
    """demo-shapes' drawings; `prefix` puts them under a channel folder as a version lays
    them out (train/circle/000.png), which the reader must see through."""
    from datasets.demo import SHAPES, draw_shape

    rng = random.Random(seed)
    paths = []
    for shape in SHAPES:
        target = folder / prefix / shape if prefix else folder / shape
        target.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            path = target / f"{index:03d}.png"
            draw_shape(shape, rng).save(path, format="PNG")
            paths.append(path)
    return paths


def test_image_classifier_learns_shapes_and_predicts(tmp_path):
    from PIL import Image

    from algorithms.predict import load_predictor

    job = JobDir(tmp_path / "job", {"epochs": 8, "batch_size": 16, "width": 8, "log_every_steps": 10})
    write_shapes(job.channel("train"), 40, seed=1, prefix="train")
    validation = write_shapes(job.channel("validation"), 10, seed=2)
    result = run_in_process(job, "algorithms.image")
    assert_ok(result)
    assert "120 train images at 32x32x3, 3 classes: circle, square, triangle" in result.stdout
    accuracy = result.last("image-classifier", "validation_accuracy")
    assert accuracy >= 0.8, result.stdout
    config = json.loads((job.model / "config.json").read_text())
    assert config["input"]["image_size"] == 32 and len(config["input"]["mean"]) == 3

    predictor = load_predictor(job.model)
    predictions = predictor.predict([str(path) for path in validation])
    hits = sum(prediction["label"] == path.parent.name for prediction, path in zip(predictions, validation, strict=True))
    assert hits / len(validation) == pytest.approx(accuracy, abs=1e-6)
    # The same image as base64, as a data: URI inside an object, and as a PIL image agree.
    encoded = base64.b64encode(validation[0].read_bytes()).decode()
    with Image.open(validation[0]) as image:
        again = predictor.predict([encoded, {"image": f"data:image/png;base64,{encoded}"}, image])
    assert {item["label"] for item in again} == {predictions[0]["label"]}
    with pytest.raises(ValueError, match="not a readable image"):
        predictor.predict(["definitely not an image"])


def test_image_outside_a_class_folder_fails_with_its_path(tmp_path):
    job = JobDir(tmp_path / "job")
    write_shapes(job.channel("train"), 2, seed=1)
    (job.channel("train") / "stray.png").write_bytes((job.channel("train") / "circle" / "000.png").read_bytes())
    result = run_in_process(job, "algorithms.image")
    assert result.returncode == 2
    assert result.failure.startswith("train/stray.png is not inside a class folder")


# --- text-classifier -----------------------------------------------------------------------
_GOOD = ("great", "wonderful", "delightful", "excellent", "lovely", "superb", "charming", "brilliant")
_BAD = ("awful", "terrible", "boring", "dreadful", "clumsy", "dull", "painful", "broken")
_NEUTRAL = ("the film", "this book", "our dinner", "the hotel", "that show", "the service", "my phone", "the trip")


def sentiment_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(("positive", "negative"))
        words = _GOOD if label == "positive" else _BAD
        text = f"{rng.choice(_NEUTRAL).capitalize()} was {rng.choice(words)}, really {rng.choice(words)}."
        rows.append({"review": text, "label": label, "stars": rng.randint(1, 5)})
    return rows


def test_text_classifier_learns_sentiment_and_predicts(tmp_path):
    from algorithms.predict import load_predictor

    job = JobDir(tmp_path / "job", {"text_column": "review", "epochs": 6, "batch_size": 16, "log_every_steps": 10})
    # JSON Lines, split over two files in a sub-folder: every file of the channel is read.
    rows = sentiment_rows(300, seed=1)
    (job.channel("train") / "part").mkdir()
    for part, chunk in enumerate((rows[:150], rows[150:])):
        (job.channel("train") / "part" / f"{part}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in chunk))
    result = run_in_process(job, "algorithms.text")
    assert_ok(result)
    assert "held out 30 of train's rows" in result.stdout  # no validation channel: a seeded 10%
    assert result.last("text-classifier", "validation_accuracy") >= 0.9

    predictor = load_predictor(job.model)
    first, second = predictor.predict(["What a wonderful, lovely trip.", {"review": "Dull and broken, awful."}])
    assert (first["label"], second["label"]) == ("positive", "negative")
    assert first["confidence"] > 0.5 and set(first["probabilities"]) == {"negative", "positive"}
    with pytest.raises(ValueError, match="no 'review' field"):
        predictor.predict([{"text": "hello"}])


def test_text_classifier_on_character_ngrams(tmp_path):
    job = JobDir(tmp_path / "job", {"text_column": "review", "token_type": "char", "ngrams": "3", "epochs": 5,
                                     "batch_size": 16})
    rows = sentiment_rows(200, seed=3)
    (job.channel("train") / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_in_process(job, "algorithms.text")
    assert_ok(result)
    assert result.last("text-classifier", "validation_accuracy") >= 0.9


def test_text_classifier_names_the_missing_text_column(tmp_path):
    job = JobDir(tmp_path / "job")
    (job.channel("train") / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in sentiment_rows(20, 1)))
    result = run_in_process(job, "algorithms.text")
    assert result.returncode == 2
    assert result.failure.startswith("text column 'text' not found in train.jsonl; columns are review, label, stars")


# --- char-lm -------------------------------------------------------------------------------
def test_char_lm_learns_reports_perplexity_and_generates(tmp_path):
    from algorithms.charlm import build_layers
    from algorithms.predict import load_predictor
    from datasets.demo import generate_text

    job = JobDir(tmp_path / "job", {"epochs": 3, "context_length": 32, "embedding_dim": 32, "heads": 2,
                                     "batch_size": 32, "log_every_steps": 10})
    rng = random.Random(5)
    (job.channel("train") / "a.txt").write_text(generate_text(30_000, rng))
    (job.channel("validation") / "b.txt").write_text(generate_text(3_000, rng))
    result = run_in_process(job, "algorithms.charlm")
    assert_ok(result)
    losses = [value for _, value in result.metric("char-lm", "train_loss")]
    assert losses[-1] < losses[0] - 0.5, losses
    perplexity = result.last("char-lm", "validation_perplexity")
    vocabulary = json.loads((job.model / "config.json").read_text())["input"]["vocabulary"]
    assert perplexity < len(vocabulary) / 2  # far better than guessing among the characters seen
    assert not (job.model / "labels.json").exists()

    generator = load_predictor(job.model)
    text = generator.generate("The old train", max_new_tokens=40, temperature=0.8, seed=3)
    assert len(text) == 40 and set(text) <= set(vocabulary)
    assert generator.generate("The old train", max_new_tokens=40, temperature=0.8, seed=3) == text
    assert generator.generate("", max_new_tokens=10, temperature=0) == generator.generate("", max_new_tokens=10, temperature=0)

    # The model is a plain stack, so a pipeline can cut it anywhere and chain the stages.
    import torch

    config = json.loads((job.model / "config.json").read_text())["architecture"]
    layers = build_layers(config)
    assert len(layers) == config["layers"] + 2
    model = generator.model
    ids = torch.randint(1, config["vocabulary_size"], (2, 16))
    with torch.no_grad():
        staged = model[2:](model[:2](ids))
        assert torch.allclose(staged, model(ids))
        assert model(ids).shape == (2, 16, config["vocabulary_size"])


def test_char_lm_rejects_heads_that_do_not_divide_the_width(tmp_path):
    job = JobDir(tmp_path / "job", {"embedding_dim": 30, "heads": 4})
    (job.channel("train") / "a.txt").write_text("hello world\n" * 50)
    result = run_in_process(job, "algorithms.charlm")
    assert result.returncode == 2
    assert result.failure == "invalid hyperparameters: heads: must divide embedding_dim (30), got 4\n"
