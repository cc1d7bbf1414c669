"""Serving a model version: its artifact extracted once per machine, its predictor loaded
once per process, and instances checked against the model's kind before they reach it.

    predictor = predictor_for(version)          # cached; concurrent first calls load once
    records, contents = parse_instances(version, body["instances"])   # InvalidInstances → 400
    predictions = predictor.predict(records)

The extracted folder is keyed by the version's id and a digest of its artifact URI and
creation time, so a recreated database (tests) never reuses another model's files. It is
written under a temporary name and renamed into place: a process that looks either finds
nothing (and extracts its own copy; the loser of the rename discards it) or a whole folder.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import shutil
import tarfile
import tempfile
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

from django.conf import settings

from hosting.models import ModelKind, ModelVersion
from studio.errors import ActionError

MAX_INSTANCES = 10_000  # per request; larger inputs are a batch prediction's job
MAX_LOADED = 8  # predictors kept per process, least recently used evicted first
MAX_PROMPT_TOKENS = 500

_lock = threading.Lock()
_loaded: OrderedDict[str, Any] = OrderedDict()
_loading: dict[str, threading.Lock] = {}
# How many times this process loaded a predictor: tests prove "once per process" with it.
load_count = 0


class InvalidInstances(ActionError, ValueError):
    """Instances of the wrong shape for the model; the message names the index (the API
    answers 400 on `instances`)."""

    def __init__(self, message: str):
        super().__init__(message, fields={"instances": message})

    def envelope_message(self) -> str:
        return self.message  # it starts with the instance it concerns: "instances[3]: …"


def cache_root() -> Path:
    root = Path(getattr(settings, "STUDIO_MODEL_CACHE_DIR", None) or Path(settings.DATA_DIR) / "model-cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_key(version: ModelVersion) -> str:
    digest = hashlib.sha256(f"{version.artifact_uri}|{version.created_at.isoformat()}".encode()).hexdigest()[:16]
    return f"{version.pk}-{digest}"


def _extract(archive: Path, target: Path) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
        for member in members:
            if member.name.startswith("/") or ".." in Path(member.name).parts:
                raise ValueError(f"the model archive entry {member.name!r} would land outside its folder")
        options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(target, members=members, **options)  # type: ignore[arg-type]


def model_dir(version: ModelVersion) -> Path:
    """The version's model/ folder on this machine, downloaded and extracted on first use."""
    from datasets.storage import store_for

    root = cache_root()
    final = root / cache_key(version)
    if (final / "config.json").is_file():
        return final
    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-{uuid.uuid4().hex[:8]}-", dir=root))
    try:
        archive = scratch / "model.tar.gz"
        store_for(version.artifact_uri).get_file(version.artifact_uri, archive)
        unpacked = scratch / "model"
        unpacked.mkdir()
        _extract(archive, unpacked)
        try:
            unpacked.rename(final)  # atomic; fails if another process got there first
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def predictor_for(version: ModelVersion) -> Any:
    """The version's predictor, loaded at most once per process: the first caller loads
    under the version's own lock while callers of other (cached) versions go on."""
    global load_count
    key = cache_key(version)
    with _lock:
        predictor = _loaded.get(key)
        if predictor is not None:
            _loaded.move_to_end(key)
            return predictor
        loading = _loading.setdefault(key, threading.Lock())
    with loading:
        with _lock:
            predictor = _loaded.get(key)
            if predictor is not None:
                return predictor
        from algorithms.predict import load_predictor

        predictor = load_predictor(model_dir(version))
        with _lock:
            load_count += 1
            _loaded[key] = predictor
            _loaded.move_to_end(key)
            while len(_loaded) > MAX_LOADED:
                _loaded.popitem(last=False)
            _loading.pop(key, None)
    return predictor


def clear_cache() -> None:
    """Forget every loaded predictor in this process (tests)."""
    global load_count
    with _lock:
        _loaded.clear()
        _loading.clear()
        load_count = 0


def warm_torch() -> None:
    """Import torch now rather than in the first request (gunicorn's post_fork may call it)."""
    import algorithms.predict  # noqa: F401


# --- instances ------------------------------------------------------------------------------
_SCALARS = (str, int, float, bool, type(None))


def _number_ok(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return value is None
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return True  # missing: the encoder uses the training mean
        try:
            return math.isfinite(float(text))  # "nan" and "inf" are no feature value
        except ValueError:
            return False
    return False


def _tabular(schema: dict[str, Any], instances: list[Any]) -> tuple[list[dict], list[dict]]:
    columns: list[str] = schema.get("columns", [])
    numeric = set(schema.get("numeric", []))
    rows: list[dict] = []
    for index, instance in enumerate(instances):
        if isinstance(instance, list):
            if len(instance) != len(columns):
                raise InvalidInstances(f"instances[{index}]: a list instance holds {len(columns)} values in column "
                                       f"order ({', '.join(columns)}), got {len(instance)}")
            row = dict(zip(columns, instance, strict=True))
        elif isinstance(instance, dict):
            row = instance
            for column in columns:
                if column not in row:
                    raise InvalidInstances(f"instances[{index}]: missing feature '{column}'")
        else:
            raise InvalidInstances(f"instances[{index}]: expected an object of feature values (or a list in column "
                                   f"order), got {type(instance).__name__}")
        for column in columns:
            value = row[column]
            if not isinstance(value, _SCALARS):
                raise InvalidInstances(f"instances[{index}]: feature '{column}' must be a number or a string, "
                                       f"got {type(value).__name__}")
            if column in numeric and not _number_ok(value):
                raise InvalidInstances(f"instances[{index}]: feature '{column}' must be a number, got {value!r}")
        rows.append({column: row[column] for column in columns})
    return rows, [{"row": row} for row in rows]


def _text(schema: dict[str, Any], instances: list[Any]) -> tuple[list[str], list[dict]]:
    column = schema.get("text_column") or "text"
    texts = []
    for index, instance in enumerate(instances):
        if isinstance(instance, dict):
            instance = instance.get("text", instance.get(column))
        if not isinstance(instance, str):
            raise InvalidInstances(f"instances[{index}]: expected a string or an object with a \"text\" string")
        texts.append(instance)
    return texts, [{"text": text} for text in texts]


def _image(instances: list[Any]) -> tuple[list[bytes], list[dict]]:
    """Base64 only: a string the predictor would otherwise also take as a server file path."""
    from PIL import Image, UnidentifiedImageError

    images, contents = [], []
    for index, instance in enumerate(instances):
        if isinstance(instance, dict):
            instance = instance.get("b64", instance.get("image"))
        if not isinstance(instance, str):
            raise InvalidInstances(f"instances[{index}]: expected a base64 image string or an object with "
                                   "\"b64\" or \"image\"")
        text = instance.split(",", 1)[1] if instance.startswith("data:") else instance
        try:
            data = base64.b64decode(text, validate=True)
            with Image.open(io.BytesIO(data)) as image:
                media_type = Image.MIME.get(image.format or "", "application/octet-stream")
                image.verify()
        except (binascii.Error, ValueError):
            raise InvalidInstances(f"instances[{index}]: not valid base64") from None
        except (UnidentifiedImageError, OSError) as exc:
            raise InvalidInstances(f"instances[{index}]: not a readable image ({exc})") from None
        images.append(data)
        contents.append({"image": text, "media_type": media_type})
    return images, contents


def _prompts(instances: list[Any]) -> tuple[list[dict], list[dict]]:
    prompts = []
    for index, instance in enumerate(instances):
        options = instance if isinstance(instance, dict) else {"prompt": instance}
        if not isinstance(options.get("prompt"), str):
            raise InvalidInstances(f"instances[{index}]: expected a prompt string or an object with a \"prompt\" string")
        try:
            tokens = int(options.get("max_new_tokens", 200))
            temperature = float(options.get("temperature", 1.0))
        except (TypeError, ValueError):
            raise InvalidInstances(f"instances[{index}]: max_new_tokens and temperature must be numbers") from None
        if not 0 < tokens <= MAX_PROMPT_TOKENS or not 0 < temperature <= 10:
            raise InvalidInstances(f"instances[{index}]: max_new_tokens is 1–{MAX_PROMPT_TOKENS}, temperature 0–10")
        prompts.append({"prompt": options["prompt"], "max_new_tokens": tokens, "temperature": temperature,
                        "seed": options.get("seed")})
    return prompts, [{"text": p["prompt"]} for p in prompts]


def parse_instances(version: ModelVersion, instances: Any) -> tuple[list[Any], list[dict]]:
    """(records for the predictor, input_content per instance for human loops)."""
    if not isinstance(instances, list):
        raise InvalidInstances("instances: expected a list")
    if not instances:
        raise InvalidInstances("instances: the list is empty")
    if len(instances) > MAX_INSTANCES:
        raise InvalidInstances(f"instances: at most {MAX_INSTANCES} per request, got {len(instances)}; "
                               "use a batch prediction for more")
    if version.kind == ModelKind.TABULAR:
        return _tabular(version.input_schema, instances)
    if version.kind == ModelKind.TEXT:
        return _text(version.input_schema, instances)
    if version.kind == ModelKind.IMAGE:
        return _image(instances)
    return _prompts(instances)
