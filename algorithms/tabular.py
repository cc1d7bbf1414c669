"""tabular-classifier: an MLP on CSV/JSONL rows. Numeric columns are standardised with
train's mean and deviation, string columns one-hot encoded with train's vocabulary; both
go into config.json so a prediction encodes a raw record exactly as training did.

torch is imported inside functions: the studio reads SPEC without paying for it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import (
    COMMON_HYPERPARAMETERS,
    TABLE_FILES,
    Accepts,
    AlgorithmSpec,
    Hyperparameter,
    metric_definition,
    training_hyperparameters,
)
from trainyard.errors import DataError

if TYPE_CHECKING:
    from torch import nn

    from algorithms.channels import Table
    from algorithms.process import Context

NAME = "tabular-classifier"
# Past this many distinct values a string column keeps only its most frequent ones (an id
# column would otherwise add thousands of inputs that cannot generalise).
MAX_CATEGORIES = 100

SPEC = AlgorithmSpec(
    name=NAME,
    title="Tabular classifier",
    description="A multilayer perceptron for CSV or JSON Lines tables: numeric columns are standardised, "
                "text columns one-hot encoded, and one column is the class to predict.",
    module="algorithms.tabular",
    formats=("csv", "jsonl"),
    accepts=Accepts(label=True, features=True, extensions=TABLE_FILES),
    hyperparameters=(
        *training_hyperparameters(epochs=10, batch_size=64, learning_rate=0.003, weight_decay=0.0001, dropout=0.1),
        Hyperparameter("hidden_units", "integer", 64, min=1, max=8192, description="Width of each hidden layer."),
        Hyperparameter("layers", "integer", 2, min=0, max=16, description="Hidden layers (0 = logistic regression)."),
        Hyperparameter("label_column", "string", "",
                       description="Column to predict; empty = the dataset's label (label, target, class, y or category)."),
        *COMMON_HYPERPARAMETERS,
    ),
    metric_definitions=tuple(metric_definition(name) for name in (
        "train_loss", "validation_loss", "validation_accuracy", "epoch", "test_loss", "test_accuracy")),
    default_objective={"metric": "validation_accuracy", "goal": "maximize"},
)


# --- encoding (numpy only, shared with predict.py) ----------------------------------------
def _number(value: Any) -> float | None:
    """The value as a finite float, or None when it is missing or not a number."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        text = str(value).strip()
        if not text:
            return None
        try:
            number = float(text)
        except ValueError:
            return None
    return number if math.isfinite(number) else None


def _category(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "" if value is None else str(value).strip()


def infer_input_schema(table: Table, label_column: str) -> dict[str, Any]:
    """Which columns are numeric (every non-empty value parses as a number), their mean and
    deviation, and every other column's vocabulary; all from train only."""
    numeric: list[dict[str, Any]] = []
    categorical: list[dict[str, Any]] = []
    for column in table.columns:
        if column == label_column:
            continue
        values = [row.get(column) for row in table.rows]
        present = [value for value in values if _category(value) != ""]
        if not present:
            continue  # an empty column carries nothing
        numbers = [_number(value) for value in present]
        if all(number is not None for number in numbers):
            array = np.array(numbers, dtype=np.float64)
            std = float(array.std())
            numeric.append({"name": column, "mean": float(array.mean()), "std": std if std > 1e-12 else 1.0})
        else:
            counts = Counter(_category(value) for value in present)
            ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:MAX_CATEGORIES]
            categorical.append({"name": column, "vocabulary": sorted(value for value, _ in ranked)})
    if not numeric and not categorical:
        raise DataError(f"{table.name} has no feature columns besides the label {label_column!r}")
    return {"label_column": label_column, "numeric": numeric, "categorical": categorical,
            "feature_columns": [item["name"] for item in numeric + categorical]}


def input_size(schema: dict[str, Any]) -> int:
    return len(schema["numeric"]) + sum(len(item["vocabulary"]) for item in schema["categorical"])


def encode_rows(rows: list[dict[str, Any]], schema: dict[str, Any]) -> np.ndarray:
    """(rows, features) float32. A missing or non-numeric number becomes the train mean (0
    after standardising); an unseen category becomes all zeros."""
    matrix = np.zeros((len(rows), input_size(schema)), dtype=np.float32)
    for position, item in enumerate(schema["numeric"]):
        name, mean, std = item["name"], item["mean"], item["std"]
        column = [_number(row.get(name)) for row in rows]
        matrix[:, position] = [0.0 if value is None else (value - mean) / std for value in column]
    offset = len(schema["numeric"])
    for item in schema["categorical"]:
        index = {value: offset + position for position, value in enumerate(item["vocabulary"])}
        for row_number, row in enumerate(rows):
            target = index.get(_category(row.get(item["name"])))
            if target is not None:
                matrix[row_number, target] = 1.0
        offset += len(item["vocabulary"])
    return matrix


# --- model ---------------------------------------------------------------------------------
def build_model(architecture: dict[str, Any]) -> nn.Module:
    from torch import nn

    layers: list[nn.Module] = []
    width = architecture["input_size"]
    for _ in range(architecture["layers"]):
        layers += [nn.Linear(width, architecture["hidden_units"]), nn.ReLU(), nn.Dropout(architecture["dropout"])]
        width = architecture["hidden_units"]
    layers.append(nn.Linear(width, architecture["num_classes"]))
    return nn.Sequential(*layers)


def make_encoder(config: dict[str, Any]):
    """records → float tensor, for predict.py."""
    import torch

    schema = config["input"]

    def encode(records: list[Any]) -> torch.Tensor:
        for record in records:
            if not isinstance(record, dict):
                raise ValueError(f"{NAME} records are objects of column → value, got {type(record).__name__}")
        return torch.from_numpy(encode_rows(records, schema))

    return encode


# --- training ------------------------------------------------------------------------------
def labelled_features(table: Table, schema: dict[str, Any], classes: list[str], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, class indices) of the rows that have a label train knows."""
    from algorithms.channels import encode_labels, label_text

    label_column = schema["label_column"]
    if label_column not in table.columns:
        raise DataError(f"label column {label_column!r} not found in {table.name}; columns are {', '.join(table.columns)}")
    rows = [row for row in table.rows if label_text(row.get(label_column)) != ""]
    targets, kept = encode_labels([label_text(row.get(label_column)) for row in rows], classes, where)
    return encode_rows([rows[i] for i in kept], schema), targets


def train(ctx: Context) -> None:
    """1. Read train (and validation/test when given) and infer the encoding from train.
    2. Without a validation channel, hold out a seeded 10% of train. 3. Fit, then write
    model/ (rank 0)."""
    import torch

    from algorithms.channels import (
        Table,
        find_label_column,
        holdout_split,
        label_text,
        label_vocabulary,
        optional_channel,
        read_table,
        required_channel,
    )
    from algorithms.output import save_model
    from algorithms.training import fit
    from trainyard.parallel.steps import Task, TensorBatches

    hps = ctx.hps
    train_table = read_table(required_channel(ctx, "train"), "train")
    label_column = find_label_column(train_table, hps["label_column"])
    train_table.rows = [row for row in train_table.rows if label_text(row.get(label_column)) != ""]
    if not train_table.rows:
        raise DataError(f"every row of {train_table.name} has an empty {label_column!r}")
    classes = label_vocabulary((label_text(row[label_column]) for row in train_table.rows), train_table.name)
    validation_folder = optional_channel(ctx, "validation")
    if validation_folder is None:
        keep, held = holdout_split(len(train_table.rows), hps["seed"])
        validation_rows = [train_table.rows[i] for i in held]
        train_table.rows = [train_table.rows[i] for i in keep]
        validation_table: Table | None = Table(f"{train_table.name} (held out)", train_table.columns, validation_rows)
        ctx.log(f"no validation channel: held out {len(held)} of train's rows (seed {hps['seed']})")
    else:
        validation_table = read_table(validation_folder, "validation")
    schema = infer_input_schema(train_table, label_column)

    def tensors(table: Table, where: str) -> TensorBatches:
        features, targets = labelled_features(table, schema, classes, where)
        return TensorBatches(torch.from_numpy(features), torch.from_numpy(targets))

    test_folder = optional_channel(ctx, "test")
    architecture = {"input_size": input_size(schema), "hidden_units": hps["hidden_units"], "layers": hps["layers"],
                    "dropout": hps["dropout"], "num_classes": len(classes)}
    ctx.log(f"{len(train_table.rows)} train rows, {architecture['input_size']} inputs "
            f"({len(schema['numeric'])} numeric, {len(schema['categorical'])} categorical columns), "
            f"{len(classes)} classes: {', '.join(classes[:10])}")
    task = Task(
        model=build_model(architecture),
        train=tensors(train_table, "train"),
        validation=tensors(validation_table, "validation") if validation_table is not None else None,
        test=tensors(read_table(test_folder, "test"), "test") if test_folder else None,
    )
    metrics = fit(ctx, task)
    save_model(ctx, task.model, architecture=architecture, input_schema=schema, labels=classes, metrics=metrics)


def main() -> None:
    from algorithms.process import run_algorithm

    run_algorithm(SPEC, train)


if __name__ == "__main__":
    main()
