"""Schema types shared by the built-in algorithms: a hyperparameter schema that drives both
the API's validation and the job form, and the spec each algorithm module exposes.

No torch here: the web server reads schemas on every request to the algorithms endpoint
and the job form, and importing torch costs more than a second.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

HyperparameterType = Literal["integer", "float", "string", "boolean", "categorical"]
HYPERPARAMETER_TYPES: tuple[str, ...] = ("integer", "float", "string", "boolean", "categorical")
_TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0"})
_TYPE_NAMES = {"integer": "an integer", "float": "a number", "string": "a string", "boolean": "true or false",
               "categorical": "one of the choices"}


@dataclass(frozen=True)
class Hyperparameter:
    name: str
    type: HyperparameterType
    default: Any
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        # A mistake in a spec is a programming error; fail at import, not on a user's job.
        if self.type not in HYPERPARAMETER_TYPES:
            raise ValueError(f"{self.name}: unknown hyperparameter type {self.type!r}")
        if self.type == "categorical" and not self.choices:
            raise ValueError(f"{self.name}: a categorical hyperparameter needs choices")
        self.coerce(self.default)

    def coerce(self, raw: Any) -> Any:
        """The value in this hyperparameter's type; ValueError("<name>: <why>") if it is not
        one. Strings that parse as the type are accepted: SageMaker passes every value as
        a string, and so do HTML forms."""
        value = self._parse(raw)
        if self.type in ("integer", "float"):
            if self.min is not None and value < self.min:
                raise ValueError(f"{self.name}: must be ≥ {_show(self.min)}, got {_show(value)}")
            if self.max is not None and value > self.max:
                raise ValueError(f"{self.name}: must be ≤ {_show(self.max)}, got {_show(value)}")
        if self.choices and value not in self.choices:
            listed = ", ".join(str(choice) for choice in self.choices)
            raise ValueError(f"{self.name}: must be one of {listed}, got {raw!r}")
        return value

    def _parse(self, raw: Any) -> Any:
        expected = f"{self.name}: expected {_TYPE_NAMES[self.type]}, got {raw!r}"
        if self.type == "integer":
            return _parse_integer(raw, expected)
        if self.type == "float":
            return _parse_float(raw, expected)
        if self.type == "boolean":
            return _parse_boolean(raw, expected)
        if self.type == "categorical":
            # Choices are matched by their text so "3" picks the choice 3 and vice versa.
            by_text = {str(choice): choice for choice in self.choices}
            if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
                raise ValueError(expected)
            if str(raw).strip() not in by_text:
                listed = ", ".join(by_text)
                raise ValueError(f"{self.name}: must be one of {listed}, got {raw!r}")
            return by_text[str(raw).strip()]
        if not isinstance(raw, str):
            # Numbers are fine as strings (a column named 3), containers are a mistake.
            if isinstance(raw, (bool, int, float)):
                return str(raw)
            raise ValueError(expected)
        return raw

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "default": self.default,
            "min": self.min,
            "max": self.max,
            "choices": list(self.choices),
            "description": self.description,
        }


def _show(number: float) -> str:
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e15 else f"{number:g}"


def _parse_integer(raw: Any, expected: str) -> int:
    if isinstance(raw, bool):
        raise ValueError(expected)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        if raw.is_integer():
            return int(raw)
        raise ValueError(expected)
    if isinstance(raw, str):
        text = raw.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            raise ValueError(expected) from None
        # "1e3" and "5.0" are integers written another way; "2.5" is not.
        if math.isfinite(number) and number.is_integer():
            return int(number)
    raise ValueError(expected)


def _parse_float(raw: Any, expected: str) -> float:
    if isinstance(raw, bool):
        raise ValueError(expected)
    if isinstance(raw, (int, float)):
        number = float(raw)
    elif isinstance(raw, str):
        try:
            number = float(raw.strip())
        except ValueError:
            raise ValueError(expected) from None
    else:
        raise ValueError(expected)
    if not math.isfinite(number):
        raise ValueError(f"{expected.split(':')[0]}: must be a finite number, got {raw!r}")
    return number


def _parse_boolean(raw: Any, expected: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(expected)


# --- what data an algorithm accepts ------------------------------------------------------
LABEL_NAMES = ("label", "target", "class", "y", "category")  # as datasets/formats infers them
FORMAT_NAMES = {"csv": "CSV", "jsonl": "JSON Lines", "image_folder": "image folders", "text": "plain text"}
TABLE_FILES = (".csv", ".tsv", ".jsonl", ".ndjson")  # = algorithms.channels.TABLE_EXTENSIONS
IMAGE_FILES = (".png", ".jpg", ".jpeg")  # = image.IMAGE_EXTENSIONS
TEXT_FILES = (".txt",)


@dataclass(frozen=True)
class Accepts:
    """The data a built-in algorithm can train on, beside AlgorithmSpec.formats. Checked
    against every channel's dataset version when a job is submitted (jobs.actions) and
    mirrored by the job form (static/js/job_form.js, from AlgorithmSpec.as_json)."""

    label: bool = False  # needs labels: a label column (tables) or class folders (images), ≥ 2 classes in train
    features: bool = False  # needs at least one column besides the label
    text_column: str = ""  # the hyperparameter naming a column that must exist (text-classifier: text_column)
    extensions: tuple[str, ...] = ()  # the file extensions it reads from a channel folder (file mode)

    def as_json(self) -> dict:
        return {"label": self.label, "features": self.features, "text_column": self.text_column,
                "extensions": list(self.extensions)}


@dataclass(frozen=True)
class DataFacts:
    """What a dataset version offers, from its validation: plain data (tests build it by
    hand; DataFacts.of reads a DatasetVersion without importing Django)."""

    name: str  # "iris v2", for messages
    format: str
    columns: tuple[str, ...] = ()
    label_column: str = ""  # the label column validation found ("" = none)
    classes: tuple[str, ...] | None = None  # the label's values (None = not listed: too many)
    extensions: tuple[str, ...] = ()  # of its files, lower case, e.g. (".csv",)

    @classmethod
    def of(cls, version: Any, files: list[dict] | None = None) -> DataFacts:
        """`files`: the version's file list when it was not loaded with it (None: read it)."""
        schema = version.schema or {}
        label = schema.get("label_column") or ""
        classes = schema.get("classes") or {}
        listed = None if schema.get("label_cardinality") == "high" or not label else tuple(sorted(classes))
        extensions = sorted({_extension(str(f.get("path", ""))) for f in (version.files if files is None else files) or []}
                            - {""})
        return cls(name=f"{version.dataset.name} v{version.version}", format=version.format or "",
                   columns=tuple(str(c.get("name")) for c in schema.get("columns") or []), label_column=label,
                   classes=listed, extensions=tuple(extensions))

    def as_json(self) -> dict:
        return {"name": self.name, "format": self.format, "columns": list(self.columns), "label_column": self.label_column,
                "classes": None if self.classes is None else len(self.classes),
                "only_class": self.classes[0] if self.classes is not None and len(self.classes) == 1 else None,
                "extensions": list(self.extensions)}


def _extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""


def _listed(names: Any, limit: int = 8) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def data_problem(spec: AlgorithmSpec, channel: str, facts: DataFacts, hyperparameters: dict[str, Any],
                 mode: str = "file") -> str | None:
    """Why `spec` cannot train on `facts` bound to `channel`, or None when it can.
    `hyperparameters`: the job's clean values (the label column validation found already
    filled in for train, as jobs.actions.check_algorithm does). Keep the wording in step
    with dataProblem in static/js/job_form.js."""
    accepts = spec.accepts
    if facts.format not in spec.formats:
        wanted = " or ".join(FORMAT_NAMES.get(f, f) for f in spec.formats)
        return (f"{facts.name} is {FORMAT_NAMES.get(facts.format, facts.format or 'of unknown format')}; "
                f"{spec.name} reads {wanted}.")
    if accepts.extensions and (mode == "file" or facts.format == "image_folder") and facts.extensions \
            and not set(facts.extensions) & set(accepts.extensions):
        return (f"{facts.name} has only {_listed(facts.extensions)} files; {spec.name} reads "
                f"{_listed(accepts.extensions)} files.")
    tabular = facts.format in ("csv", "jsonl")
    label = str(hyperparameters.get("label_column") or "") if tabular else facts.label_column
    if accepts.label and tabular:
        if not label:
            return (f"{facts.name} has no label column: none of its columns ({_listed(facts.columns)}) is named "
                    f"{', '.join(LABEL_NAMES)} and none was given at upload. Set hyperparameters.label_column, or "
                    "upload it again with the label column.")
        if label not in facts.columns:
            return f"{facts.name} has no column {label!r} (label_column); its columns are {_listed(facts.columns)}."
    if accepts.text_column and tabular:
        text = str(hyperparameters.get(accepts.text_column) or "")
        if text not in facts.columns:
            return (f"{facts.name} has no column {text!r} ({accepts.text_column}); its columns are "
                    f"{_listed(facts.columns)}. Set hyperparameters.{accepts.text_column}.")
    if accepts.features and tabular and not [column for column in facts.columns if column != label]:
        return f"{facts.name} has no feature columns besides the label {label!r}."
    if accepts.label and channel == "train" and label and label == facts.label_column and facts.classes is not None \
            and len(facts.classes) < 2:
        found = f"only {facts.classes[0]!r}" if facts.classes else "no labels"
        return f"{facts.name} has {found} in {label!r}: a classifier needs at least two classes."
    return None


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    title: str
    description: str
    module: str  # what torch.distributed.run runs with -m
    formats: tuple[str, ...]  # dataset formats it reads: "csv", "jsonl", "image_folder", "text"
    hyperparameters: tuple[Hyperparameter, ...]
    metric_definitions: tuple[dict[str, str], ...]  # [{"name", "regex"}] over the stdout lines it prints
    default_objective: dict[str, str]  # {"metric": ..., "goal": "maximize" | "minimize"}
    required_channels: tuple[str, ...] = ("train",)
    optional_channels: tuple[str, ...] = ("validation", "test")
    distributions: tuple[str, ...] = ("none", "ddp")
    accepts: Accepts = Accepts()  # beside formats: labels, columns, file extensions (see data_problem)
    # Rules between fields (embedding_dim divisible by heads): clean values → {field: message}.
    check: Callable[[dict[str, Any]], dict[str, str]] | None = field(default=None, repr=False, compare=False)
    # Pipeline parallel: how many layers (cuttable units) the model has for these clean
    # hyperparameters, so the API can check a `pipeline.partition` list and `stages`.
    layer_count: Callable[[dict[str, Any]], int] | None = field(default=None, repr=False, compare=False)
    _by_name: dict[str, Hyperparameter] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {hp.name: hp for hp in self.hyperparameters})
        if len(self._by_name) != len(self.hyperparameters):
            raise ValueError(f"{self.name}: duplicate hyperparameter names")

    def hyperparameter(self, name: str) -> Hyperparameter | None:
        return self._by_name.get(name)

    def defaults(self) -> dict[str, Any]:
        return {hp.name: hp.default for hp in self.hyperparameters}

    def metric_names(self) -> list[str]:
        return [definition["name"] for definition in self.metric_definitions]

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "formats": list(self.formats),
            "accepts": self.accepts.as_json(),
            "channels": {"required": list(self.required_channels), "optional": list(self.optional_channels)},
            "distributions": list(self.distributions),
            "hyperparameters": [hp.as_json() for hp in self.hyperparameters],
            "metric_definitions": [dict(definition) for definition in self.metric_definitions],
            "default_objective": dict(self.default_objective),
        }


def validate_hyperparameters(spec: AlgorithmSpec, values: dict | None, *,
                             allow_unknown: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
    """(clean values with every default filled in, one error message per bad field).

    None or "" for a field means "use the default", so a form's untouched field and an
    omitted key behave alike. With allow_unknown, names the schema does not know are
    dropped silently (the training process tolerates extras a launcher may add; the API
    does not, so a typo never goes unnoticed)."""
    errors: dict[str, str] = {}
    if values is None:
        values = {}
    if not isinstance(values, dict):
        return spec.defaults(), {"hyperparameters": f"hyperparameters: expected an object, got {values!r}"}
    clean = spec.defaults()
    known = [hp.name for hp in spec.hyperparameters]
    for name, raw in values.items():
        hyperparameter = spec.hyperparameter(str(name))
        if hyperparameter is None:
            if not allow_unknown:
                errors[str(name)] = _unknown_message(str(name), known, spec.name)
            continue
        if raw is None or (isinstance(raw, str) and raw.strip() == "" and hyperparameter.type != "string"):
            continue
        try:
            clean[hyperparameter.name] = hyperparameter.coerce(raw)
        except ValueError as exc:
            errors[hyperparameter.name] = str(exc)
    if not errors and spec.check is not None:
        errors.update(spec.check(clean))
    return clean, errors


def _unknown_message(name: str, known: list[str], algorithm: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"{algorithm} takes {', '.join(known)}"
    return f"{name}: unknown hyperparameter for {algorithm}; {hint}"


# --- pieces every built-in algorithm shares ------------------------------------------------
NUMBER = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"


def metric_definition(name: str) -> dict[str, str]:
    """The regex for the `name=value` token the algorithms print (see algorithms.metrics.MetricLogger)."""
    return {"name": name, "regex": rf"(?:^|\s){name}={NUMBER}"}


def training_hyperparameters(*, epochs: int, batch_size: int, learning_rate: float, weight_decay: float = 0.0,
                             dropout: float = 0.1) -> tuple[Hyperparameter, ...]:
    """The loop's knobs, with per-algorithm defaults."""
    return (
        Hyperparameter("epochs", "integer", epochs, min=1, max=10_000, description="Passes over the training data."),
        Hyperparameter("batch_size", "integer", batch_size, min=1, max=65_536,
                       description="Records per optimizer step on each process."),
        Hyperparameter("learning_rate", "float", learning_rate, min=1e-7, max=1.0, description="AdamW step size."),
        Hyperparameter("weight_decay", "float", weight_decay, min=0.0, max=1.0, description="AdamW weight decay."),
        Hyperparameter("dropout", "float", dropout, min=0.0, max=0.9, description="Dropout probability while training."),
    )


COMMON_HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter("seed", "integer", 42, min=0, max=2**31 - 1,
                   description="Seeds weights, shuffling, dropout and the held-out split: same seed, same result."),
    Hyperparameter("max_steps", "integer", 0, min=0, max=10**9,
                   description="Stop after this many optimizer steps in total (0 = no limit)."),
    Hyperparameter("log_every_steps", "integer", 20, min=1, max=10**6,
                   description="Report train_loss (averaged since the last report) every this many steps."),
)
