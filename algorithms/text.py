"""text-classifier: a bag of word or character n-grams (fastText-style EmbeddingBag, mean
of n-gram vectors, then a linear layer) on a text column of CSV/JSONL rows. Simple, fast
on a CPU, and a strong baseline; the n-gram vocabulary goes into config.json.

torch is imported inside functions: the studio reads SPEC without paying for it.
"""

from __future__ import annotations

import re
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
    from trainyard.parallel.steps import TensorBatches

NAME = "text-classifier"
PADDING = 0  # index 0 pads short records; EmbeddingBag leaves it out of the mean
_WORD = re.compile(r"\w+|[^\w\s]")

SPEC = AlgorithmSpec(
    name=NAME,
    title="Text classifier",
    description="Classifies a text column of CSV or JSON Lines rows from its bag of word or character n-grams "
                "(an averaged embedding and a linear layer, like fastText).",
    module="algorithms.text",
    formats=("csv", "jsonl"),
    accepts=Accepts(label=True, text_column="text_column", extensions=TABLE_FILES),
    hyperparameters=(
        *training_hyperparameters(epochs=10, batch_size=32, learning_rate=0.005, weight_decay=0.0, dropout=0.1),
        Hyperparameter("text_column", "string", "text", description="Column holding the text."),
        Hyperparameter("label_column", "string", "",
                       description="Column to predict; empty = the dataset's label (label, target, class, y or category)."),
        Hyperparameter("token_type", "categorical", "word", choices=("word", "char"),
                       description="Build n-grams of words or of characters."),
        Hyperparameter("ngrams", "integer", 2, min=1, max=6, description="Longest n-gram (1 = single words or characters)."),
        Hyperparameter("max_vocabulary", "integer", 50_000, min=10, max=2_000_000,
                       description="Keep the most frequent n-grams of train, up to this many."),
        Hyperparameter("min_count", "integer", 1, min=1, max=1_000_000,
                       description="Drop n-grams seen fewer times than this in train."),
        Hyperparameter("max_tokens", "integer", 512, min=1, max=100_000,
                       description="N-grams kept per record (the first ones)."),
        Hyperparameter("embedding_dim", "integer", 64, min=2, max=4096, description="Size of each n-gram vector."),
        *COMMON_HYPERPARAMETERS,
    ),
    metric_definitions=tuple(metric_definition(name) for name in (
        "train_loss", "validation_loss", "validation_accuracy", "epoch", "test_loss", "test_accuracy")),
    default_objective={"metric": "validation_accuracy", "goal": "maximize"},
)


# --- tokens (no torch, shared with predict.py) ----------------------------------------------
def ngrams_of(text: str, token_type: str, longest: int) -> list[str]:
    """Lower-cased n-grams of 1..longest words (or characters, with a space at each end so
    word starts and ends are n-grams of their own), shortest first."""
    if token_type == "word":
        units = _WORD.findall(text.lower())
        joiner = " "
    else:
        units = list(f" {' '.join(text.lower().split())} ")
        joiner = ""
    grams: list[str] = []
    for size in range(1, longest + 1):
        grams.extend(joiner.join(units[start:start + size]) for start in range(len(units) - size + 1))
    return grams


def build_vocabulary(texts: list[str], hps: dict[str, Any]) -> list[str]:
    counts: Counter = Counter()
    for text in texts:
        counts.update(ngrams_of(text, hps["token_type"], hps["ngrams"]))
    frequent = [(gram, count) for gram, count in counts.items() if count >= hps["min_count"]]
    # Ties broken by the n-gram itself, so the vocabulary does not depend on dict order.
    frequent.sort(key=lambda item: (-item[1], item[0]))
    return [gram for gram, _ in frequent[:hps["max_vocabulary"]]]


def encode_texts(texts: list[str], schema: dict[str, Any]) -> np.ndarray:
    """(records, longest) int64 n-gram indices, PADDING-filled; unknown n-grams are dropped."""
    index = {gram: position + 1 for position, gram in enumerate(schema["vocabulary"])}
    encoded = []
    for text in texts:
        grams = ngrams_of(text, schema["token_type"], schema["ngrams"])
        encoded.append([index[gram] for gram in grams if gram in index][:schema["max_tokens"]])
    matrix = np.full((len(texts), max([1, *map(len, encoded)])), PADDING, dtype=np.int64)
    for row, indices in enumerate(encoded):
        matrix[row, :len(indices)] = indices
    return matrix


def text_of(record: Any, text_column: str) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        if text_column not in record:
            raise ValueError(f"record has no {text_column!r} field (fields: {', '.join(map(str, record))})")
        value = record[text_column]
        return "" if value is None else str(value)
    raise ValueError(f"{NAME} records are text or objects with a {text_column!r} field, got {type(record).__name__}")


# --- model ---------------------------------------------------------------------------------
def build_model(architecture: dict[str, Any]) -> nn.Module:
    from torch import nn

    # A 2-D input to EmbeddingBag is one fixed-length bag per row; padding_idx keeps the
    # padding out of each mean, so a Sequential needs no offsets tensor.
    return nn.Sequential(
        nn.EmbeddingBag(architecture["vocabulary_size"] + 1, architecture["embedding_dim"], mode="mean",
                        padding_idx=PADDING),
        nn.Dropout(architecture["dropout"]),
        nn.Linear(architecture["embedding_dim"], architecture["num_classes"]),
    )


def make_encoder(config: dict[str, Any]):
    """records (text, or objects with the text column) → index tensor, for predict.py."""
    import torch

    schema = config["input"]

    def encode(records: list[Any]) -> torch.Tensor:
        return torch.from_numpy(encode_texts([text_of(record, schema["text_column"]) for record in records], schema))

    return encode


# --- training ------------------------------------------------------------------------------
def _texts_and_labels(table: Table, text_column: str, label_column: str) -> tuple[list[str], list[str]]:
    from algorithms.channels import label_text

    for column, role in ((text_column, "text"), (label_column, "label")):
        if column not in table.columns:
            raise DataError(f"{role} column {column!r} not found in {table.name}; columns are {', '.join(table.columns)}")
    rows = [row for row in table.rows if label_text(row.get(label_column)) != ""]
    return [text_of(row, text_column) for row in rows], [label_text(row.get(label_column)) for row in rows]


def train(ctx: Context) -> None:
    """1. Read the text and label columns. 2. Without a validation channel, hold out a
    seeded 10%. 3. Build the n-gram vocabulary from train. 4. Fit, write model/ (rank 0)."""
    import torch

    from algorithms.channels import (
        encode_labels,
        find_label_column,
        holdout_split,
        label_vocabulary,
        optional_channel,
        read_table,
        required_channel,
    )
    from algorithms.output import save_model
    from algorithms.training import fit
    from trainyard.parallel.steps import Task, TensorBatches

    hps = ctx.hps
    table = read_table(required_channel(ctx, "train"), "train")
    if hps["text_column"] not in table.columns:
        raise DataError(f"text column {hps['text_column']!r} not found in {table.name}; columns are "
                        f"{', '.join(table.columns)} (set the hyperparameter text_column)")
    label_column = find_label_column(table, hps["label_column"])
    texts, labels = _texts_and_labels(table, hps["text_column"], label_column)
    classes = label_vocabulary(labels, table.name)
    validation_folder = optional_channel(ctx, "validation")
    if validation_folder is None:
        keep, held = holdout_split(len(texts), hps["seed"])
        validation: tuple[list[str], list[str]] | None = ([texts[i] for i in held], [labels[i] for i in held])
        texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
        ctx.log(f"no validation channel: held out {len(held)} of train's rows (seed {hps['seed']})")
    else:
        validation = _texts_and_labels(read_table(validation_folder, "validation"), hps["text_column"], label_column)
    vocabulary = build_vocabulary(texts, hps)
    if not vocabulary:
        raise DataError(f"no n-grams left in {table.name} after min_count={hps['min_count']}: lower min_count")
    schema = {"text_column": hps["text_column"], "label_column": label_column, "token_type": hps["token_type"],
              "ngrams": hps["ngrams"], "max_tokens": hps["max_tokens"], "vocabulary": vocabulary}

    def tensors(part_texts: list[str], part_labels: list[str], where: str) -> TensorBatches:
        targets, kept = encode_labels(part_labels, classes, where)
        indices = encode_texts([part_texts[i] for i in kept], schema)
        return TensorBatches(torch.from_numpy(indices), torch.from_numpy(targets))

    test_folder = optional_channel(ctx, "test")
    test = _texts_and_labels(read_table(test_folder, "test"), hps["text_column"], label_column) if test_folder else None
    architecture = {"vocabulary_size": len(vocabulary), "embedding_dim": hps["embedding_dim"], "dropout": hps["dropout"],
                    "num_classes": len(classes)}
    ctx.log(f"{len(texts)} train texts, {len(vocabulary)} {hps['token_type']} n-grams (n ≤ {hps['ngrams']}), "
            f"{len(classes)} classes: {', '.join(classes[:10])}")
    task = Task(
        model=build_model(architecture),
        train=tensors(texts, labels, "train"),
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
