"""image-classifier: a small CNN on image folders (`<class>/<name>.png`, optionally under
train/ validation/ test/ folders). Images are resized to image_size × image_size and
normalised with train's per-channel mean and deviation, recorded in config.json.

torch is imported inside functions: the studio reads SPEC without paying for it.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import (
    COMMON_HYPERPARAMETERS,
    IMAGE_FILES,
    Accepts,
    AlgorithmSpec,
    Hyperparameter,
    metric_definition,
    training_hyperparameters,
)
from trainyard.errors import DataError

if TYPE_CHECKING:
    from PIL import Image
    from torch import nn

    from algorithms.process import Context
    from trainyard.parallel.steps import TensorBatches

NAME = "image-classifier"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
_CHANNEL_FOLDERS = frozenset({"train", "validation", "valid", "val", "test"})

SPEC = AlgorithmSpec(
    name=NAME,
    title="Image classifier",
    description="A small convolutional network for folders of images, one folder per class "
                "(cat/001.png, dog/002.png).",
    module="algorithms.image",
    formats=("image_folder",),
    accepts=Accepts(label=True, extensions=IMAGE_FILES),
    hyperparameters=(
        *training_hyperparameters(epochs=12, batch_size=32, learning_rate=0.003, weight_decay=0.0001, dropout=0.1),
        Hyperparameter("image_size", "integer", 32, min=8, max=512,
                       description="Images are resized to this many pixels square."),
        Hyperparameter("channels", "integer", 3, choices=(1, 3), description="3 = colour (RGB), 1 = grayscale."),
        Hyperparameter("width", "integer", 16, min=2, max=512,
                       description="Filters in the first convolution; each of the three blocks doubles it."),
        *COMMON_HYPERPARAMETERS,
    ),
    metric_definitions=tuple(metric_definition(name) for name in (
        "train_loss", "validation_loss", "validation_accuracy", "epoch", "test_loss", "test_accuracy")),
    default_objective={"metric": "validation_accuracy", "goal": "maximize"},
)


# --- images (numpy and Pillow, shared with predict.py) ------------------------------------
def class_of(relative: Path) -> str | None:
    """The class folder of an image path inside a channel (same rule as dataset validation:
    a leading train/validation/test folder is skipped)."""
    parts = relative.parts
    if parts[0].lower() in _CHANNEL_FOLDERS and len(parts) >= 3:
        return parts[1]
    return parts[0] if len(parts) >= 2 else None


def to_array(image: Image.Image, size: int, channels: int) -> np.ndarray:
    """(channels, size, size) uint8."""
    from PIL import Image

    converted = image.convert("L" if channels == 1 else "RGB").resize((size, size), Image.Resampling.BILINEAR)
    array = np.asarray(converted, dtype=np.uint8)
    return array[None, :, :] if channels == 1 else array.transpose(2, 0, 1)


def normalise(arrays: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    scaled = arrays.astype(np.float32) / 255.0
    return (scaled - np.array(mean, dtype=np.float32)[None, :, None, None]) / np.array(std, dtype=np.float32)[None, :, None, None]


def read_images(folder: Path, channel: str, size: int, channels: int) -> tuple[np.ndarray, list[str]]:
    """(images (N, channels, size, size) uint8, class of each) for every image in the channel."""
    from PIL import Image, UnidentifiedImageError

    from algorithms.channels import data_files
    from trainyard.data import open_files, read_manifest

    if read_manifest(folder) is not None:
        # stream mode: each image is read from the object store as training starts
        sources = ((Path(path), lambda stream=stream: io.BytesIO(stream.read()))
                   for path, stream in open_files(folder) if path.lower().endswith(IMAGE_EXTENSIONS))
    else:
        sources = ((path.relative_to(folder), lambda path=path: path) for path in data_files(folder, IMAGE_EXTENSIONS, channel))
    arrays, labels = [], []
    for relative, open_source in sources:
        label = class_of(relative)
        if label is None:
            raise DataError(f"{channel}/{relative.as_posix()} is not inside a class folder: put each image in a folder "
                            "named after its class, like cat/001.png")
        try:
            with Image.open(open_source()) as image:
                arrays.append(to_array(image, size, channels))
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"{channel}/{relative.as_posix()} is not a readable image: {exc}") from None
        labels.append(label)
    if not arrays:
        raise DataError(f"no {', '.join(IMAGE_EXTENSIONS)} files in channel {channel!r}")
    return np.stack(arrays), labels


def _is_file(text: str) -> bool:
    """Whether text names a file; a base64 image longer than a file name can be is not one
    (Path.is_file raises "File name too long" for it rather than answering False)."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def decode_record(record: Any) -> Image.Image:
    """One prediction input: a PIL image, raw bytes, a file path, base64 (or a data: URI),
    or an object with "image", "image_base64" or "path"."""
    from PIL import Image

    if isinstance(record, Image.Image):
        return record
    if isinstance(record, dict):
        for key in ("image", "image_base64", "path", "b64"):
            if key in record:
                return decode_record(record[key])
        raise ValueError(f"{NAME} record objects need an 'image' (base64) or 'path' key")
    if isinstance(record, (bytes, bytearray)):
        return Image.open(io.BytesIO(record))
    if isinstance(record, str):
        if record.startswith("data:"):
            record = record.split(",", 1)[-1]
        elif len(record) < 4096 and _is_file(record):
            return Image.open(record)
        try:
            return Image.open(io.BytesIO(base64.b64decode(record, validate=True)))
        except (binascii.Error, ValueError, OSError) as exc:
            raise ValueError(f"not a readable image (base64 or an existing path): {exc}") from None
    raise ValueError(f"{NAME} records are images (base64 text, bytes or a path), got {type(record).__name__}")


# --- model ---------------------------------------------------------------------------------
def build_model(architecture: dict[str, Any]) -> nn.Module:
    from torch import nn

    width = architecture["width"]

    def block(inputs: int, outputs: int) -> list[nn.Module]:
        # BatchNorm makes a tiny CNN learn in a few epochs; DDP keeps its buffers in step.
        return [nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(
        *block(architecture["channels"], width), *block(width, 2 * width), *block(2 * width, 4 * width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(architecture["dropout"]),
        nn.Linear(4 * width, architecture["num_classes"]),
    )


def make_encoder(config: dict[str, Any]):
    """records → normalised float tensor, for predict.py."""
    import torch

    schema = config["input"]

    def encode(records: list[Any]) -> torch.Tensor:
        # Not closed here: a PIL image may be the caller's; one opened from bytes or a
        # path is read whole by convert() and closes its file itself.
        arrays = [to_array(decode_record(record), schema["image_size"], schema["channels"]) for record in records]
        return torch.from_numpy(normalise(np.stack(arrays), schema["mean"], schema["std"]))

    return encode


# --- training ------------------------------------------------------------------------------
def train(ctx: Context) -> None:
    """1. Load every image of train (and validation/test) at image_size. 2. Per-channel
    statistics from train. 3. Fit, then write model/ (rank 0)."""
    import torch

    from algorithms.channels import encode_labels, holdout_split, label_vocabulary, optional_channel, required_channel
    from algorithms.output import save_model
    from algorithms.training import fit
    from trainyard.parallel.steps import Task, TensorBatches

    hps = ctx.hps
    size, channels = hps["image_size"], hps["channels"]
    images, labels = read_images(required_channel(ctx, "train"), "train", size, channels)
    classes = label_vocabulary(labels, "train")
    validation_folder = optional_channel(ctx, "validation")
    if validation_folder is None:
        keep, held = holdout_split(len(labels), hps["seed"])
        validation: tuple[np.ndarray, list[str]] | None = (images[held], [labels[i] for i in held])
        images, labels = images[keep], [labels[i] for i in keep]
        ctx.log(f"no validation channel: held out {len(held)} of train's images (seed {hps['seed']})")
    else:
        validation = read_images(validation_folder, "validation", size, channels)
    scaled = images.astype(np.float64) / 255.0
    mean = scaled.mean(axis=(0, 2, 3)).tolist()
    std = [max(value, 1e-6) for value in scaled.std(axis=(0, 2, 3)).tolist()]
    schema = {"image_size": size, "channels": channels, "mean": mean, "std": std}

    def tensors(arrays: np.ndarray, names: list[str], where: str) -> TensorBatches:
        targets, kept = encode_labels(names, classes, where)
        return TensorBatches(torch.from_numpy(normalise(arrays[kept], mean, std)), torch.from_numpy(targets))

    test_folder = optional_channel(ctx, "test")
    test = read_images(test_folder, "test", size, channels) if test_folder else None
    architecture = {"image_size": size, "channels": channels, "width": hps["width"], "dropout": hps["dropout"],
                    "num_classes": len(classes)}
    ctx.log(f"{len(labels)} train images at {size}x{size}x{channels}, {len(classes)} classes: {', '.join(classes[:10])}")
    task = Task(
        model=build_model(architecture),
        train=tensors(images, labels, "train"),
        validation=tensors(*validation, "validation") if validation is not None else None,
        test=tensors(*test, "test") if test is not None else None,
    )
    metrics = fit(ctx, task)
    save_model(ctx, task.model, architecture=architecture, input_schema=schema, labels=classes, metrics=metrics)


def main() -> None:
    from algorithms.process import run_algorithm

    run_algorithm(SPEC, train)


if __name__ == "__main__":
    main()
