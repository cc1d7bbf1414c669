"""Demo data made by code: three small datasets, one per built-in kind of trainer, so a
fresh studio has something to train on without any download.

Every generator is seeded, so the files (and therefore their content hashes) are the
same on every machine and every run: loading the demo twice finds the existing versions
instead of adding new ones.
"""

from __future__ import annotations

import csv
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

from datasets.actions import VersionOptions, register_local_files
from datasets.models import DatasetVersion
from datasets.validation_run import run_validation
from studio.models import Project

if TYPE_CHECKING:
    from django.contrib.auth.models import User

SEED = 20240607

# --- tabular ------------------------------------------------------------------------------
TABULAR_CLASSES = ("alpine", "coastal", "desert")
TABULAR_FEATURES = 10
TABULAR_REGIONS = ("north", "south", "east", "west")
TABULAR_TRAIN_ROWS = 8000
TABULAR_VALIDATION_ROWS = 2000
# A few percent of labels are flipped so the task is not trivially perfect: a good model
# lands in the mid-90s, a broken one far below — a useful signal in a demo chart.
TABULAR_LABEL_NOISE = 0.03

# --- images -------------------------------------------------------------------------------
SHAPES = ("circle", "square", "triangle")
SHAPES_PER_CLASS = {"train": 100, "validation": 30}
IMAGE_SIZE = 32

# --- text ---------------------------------------------------------------------------------
TEXT_TRAIN_CHARS = 300_000
TEXT_VALIDATION_CHARS = 30_000


@dataclass(frozen=True)
class DemoDataset:
    name: str
    description: str
    options: VersionOptions
    write: Callable[[Path], dict[str, Path]]


def tabular_centers() -> tuple[np.random.Generator, np.ndarray]:
    """The demo's generator after drawing the class centres, and the centres: fresh records
    from the same clusters (a held-out set, an endpoint's traffic) start from these."""
    rng = np.random.default_rng(SEED)
    return rng, rng.normal(0.0, 1.0, size=(len(TABULAR_CLASSES), TABULAR_FEATURES)) * 0.75


def tabular_records(rows: int, seed: int, label_noise: float = TABULAR_LABEL_NOISE) -> list[dict[str, str]]:
    """`rows` fresh demo rows (as the CSV holds them, label included) from the demo's clusters,
    drawn with their own seed; label_noise=0 gives the true class of every row (a gold set)."""
    _, centers = tabular_centers()
    features, region, labels = tabular_arrays(rows, np.random.default_rng(seed), centers, label_noise)
    header = [f"feature_{i:02d}" for i in range(1, TABULAR_FEATURES + 1)]
    return [{**dict(zip(header, (f"{value:.4f}" for value in row), strict=True)), "region": TABULAR_REGIONS[reg],
             "label": TABULAR_CLASSES[lab]} for row, reg, lab in zip(features, region, labels, strict=True)]


def tabular_arrays(rows: int, rng: np.random.Generator, centers: np.ndarray,
                   label_noise: float = TABULAR_LABEL_NOISE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian clusters around one centre per class: features, region index, label index."""
    labels = rng.integers(0, len(TABULAR_CLASSES), size=rows)
    features = centers[labels] + rng.normal(0.0, 1.0, size=(rows, TABULAR_FEATURES))
    # The region leans towards one class per region, so the categorical column carries
    # some signal (a trainer that one-hot encodes it does slightly better).
    region = np.where(rng.random(rows) < 0.5, labels % len(TABULAR_REGIONS), rng.integers(0, len(TABULAR_REGIONS), size=rows))
    flip = rng.random(rows) < label_noise
    labels = np.where(flip, rng.integers(0, len(TABULAR_CLASSES), size=rows), labels)
    return features, region, labels


def write_tabular(root: Path) -> dict[str, Path]:
    rng, centers = tabular_centers()
    header = [f"feature_{i:02d}" for i in range(1, TABULAR_FEATURES + 1)] + ["region", "label"]
    files: dict[str, Path] = {}
    for filename, rows in (("train.csv", TABULAR_TRAIN_ROWS), ("validation.csv", TABULAR_VALIDATION_ROWS)):
        features, region, labels = tabular_arrays(rows, rng, centers)
        path = root / filename
        with open(path, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(header)
            for row, reg, lab in zip(features, region, labels, strict=True):
                writer.writerow([f"{value:.4f}" for value in row] + [TABULAR_REGIONS[reg], TABULAR_CLASSES[lab]])
        files[filename] = path
    return files


def _random_colour(rng: random.Random) -> tuple[int, int, int]:
    # Bright enough to stand out against the dark backgrounds below.
    return rng.randint(120, 255), rng.randint(120, 255), rng.randint(120, 255)


def draw_shape(shape: str, rng: random.Random) -> Image.Image:
    background = (rng.randint(0, 60), rng.randint(0, 60), rng.randint(0, 60))
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), background)
    draw = ImageDraw.Draw(image)
    size = rng.randint(12, 26)
    left = rng.randint(1, IMAGE_SIZE - size - 1)
    top = rng.randint(1, IMAGE_SIZE - size - 1)
    box = (left, top, left + size, top + size)
    colour = _random_colour(rng)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([(left + size / 2, top), (left, top + size), (left + size, top + size)], fill=colour)
    return image


def write_shapes(root: Path) -> dict[str, Path]:
    rng = random.Random(SEED)
    files: dict[str, Path] = {}
    for channel, per_class in SHAPES_PER_CLASS.items():
        for shape in SHAPES:
            folder = root / channel / shape
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_class):
                rel = f"{channel}/{shape}/{index:03d}.png"
                path = root / rel
                # optimize=False and no timestamps: PNG bytes depend only on the pixels.
                draw_shape(shape, rng).save(path, format="PNG")
                files[rel] = path
    return files


# A tiny grammar; sentences are varied enough that a character model has structure to
# learn (words, punctuation, capitals) but small enough to train in minutes on a CPU.
_SUBJECTS = ("the engineer", "a quiet fox", "the old train", "my neighbour", "the night shift", "a small robot",
             "the harbour master", "every student", "the red kite", "our team", "the baker", "a tired traveller")
_VERBS = ("watches", "repairs", "follows", "paints", "counts", "remembers", "carries", "measures", "greets", "finds")
_OBJECTS = ("the signal lamps", "a broken clock", "the morning fog", "seven blue boxes", "the long platform",
            "a letter from home", "the river bridge", "three warm loaves", "the last timetable", "a field of wheat")
_PLACES = ("near the station", "before dawn", "in the rain", "after supper", "along the canal", "at the end of the line",
           "under the old oak", "beside the sea", "without a word", "on a Tuesday")
_CONNECTIVES = ("and then", "while", "because", "so", "but")


def _sentence(rng: random.Random) -> str:
    clause = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    if rng.random() < 0.6:
        clause += f" {rng.choice(_PLACES)}"
    if rng.random() < 0.35:
        clause += f", {rng.choice(_CONNECTIVES)} {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    ending = rng.choices((".", "!", "?"), weights=(8, 1, 1))[0]
    return clause[0].upper() + clause[1:] + ending


def generate_text(chars: int, rng: random.Random) -> str:
    """Paragraphs of 2–5 sentences, one paragraph per line (a record per line)."""
    lines: list[str] = []
    total = 0
    while total < chars:
        line = " ".join(_sentence(rng) for _ in range(rng.randint(2, 5)))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


def write_text(root: Path) -> dict[str, Path]:
    rng = random.Random(SEED)
    files: dict[str, Path] = {}
    for filename, chars in (("train.txt", TEXT_TRAIN_CHARS), ("validation.txt", TEXT_VALIDATION_CHARS)):
        path = root / filename
        path.write_text(generate_text(chars, rng), encoding="utf-8")
        files[filename] = path
    return files


DEMO_DATASETS = (
    DemoDataset("demo-tabular", "Synthetic 3-class table: 10 numeric features and a region; predict `label`.",
                VersionOptions(format="csv", label_column="label"), write_tabular),
    DemoDataset("demo-shapes", "32×32 PNGs of circles, squares and triangles in random colours and places.",
                VersionOptions(format="image_folder"), write_shapes),
    DemoDataset("demo-text", "Sentences from a small grammar, for a character-level language model.",
                VersionOptions(format="text"), write_text),
)


def load_demo_data(project: Project, user: User | None) -> list[DatasetVersion]:
    """1. Write each dataset's files into a temporary folder.
    2. Register them (identical content returns the existing version).
    3. Validate synchronously, so the versions are ready when this returns; the task that
       registration also enqueues finds the version done and does nothing."""
    versions: list[DatasetVersion] = []
    for demo in DEMO_DATASETS:
        with tempfile.TemporaryDirectory(prefix=f"trainyard-{demo.name}-") as tmp:
            files = demo.write(Path(tmp))
            version, _ = register_local_files(project=project, name=demo.name, description=demo.description, user=user,
                                              files=files, options=demo.options)
        run_validation(version.pk)
        version.refresh_from_db()
        versions.append(version)
    return versions
