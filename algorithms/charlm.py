"""char-lm: a small decoder-only transformer over the characters of plain .txt files.

The model is a plain stack — embedding block, N transformer blocks, head — built by
build_layers(), so a pipeline-parallel run (trainyard.parallel.stages) can cut the list into
stages and nothing else changes; a sharded one (trainyard.parallel.fsdp) shards it layer by
layer. torch is imported inside functions (the layer classes are defined on first use):
the studio reads SPEC without paying for it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms.base import (
    COMMON_HYPERPARAMETERS,
    TEXT_FILES,
    Accepts,
    AlgorithmSpec,
    Hyperparameter,
    metric_definition,
    training_hyperparameters,
)
from trainyard.errors import DataError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from algorithms.process import Context
    from trainyard.parallel.steps import TensorBatches

NAME = "char-lm"
UNKNOWN = 0  # index 0: a character train never had; vocabulary[i - 1] is character i


def layer_count(values: dict[str, Any]) -> int:
    """What build_layers returns: the embedding block, the blocks and the head."""
    return int(values["layers"]) + 2


def _check(values: dict[str, Any]) -> dict[str, str]:
    if values["embedding_dim"] % values["heads"]:
        return {"heads": f"heads: must divide embedding_dim ({values['embedding_dim']}), got {values['heads']}"}
    return {}


SPEC = AlgorithmSpec(
    name=NAME,
    title="Character language model",
    description="A small decoder-only transformer that learns to continue plain text one character at a time; "
                "reports loss and perplexity, and generates text from a prompt.",
    module="algorithms.charlm",
    formats=("text",),
    accepts=Accepts(extensions=TEXT_FILES),
    hyperparameters=(
        *training_hyperparameters(epochs=2, batch_size=32, learning_rate=0.003, weight_decay=0.01, dropout=0.1),
        Hyperparameter("context_length", "integer", 64, min=4, max=4096, description="Characters the model sees at once."),
        Hyperparameter("embedding_dim", "integer", 64, min=8, max=4096, description="Width of the model."),
        Hyperparameter("layers", "integer", 2, min=1, max=64, description="Transformer blocks."),
        Hyperparameter("heads", "integer", 4, min=1, max=64, description="Attention heads (must divide embedding_dim)."),
        *COMMON_HYPERPARAMETERS,
    ),
    metric_definitions=tuple(metric_definition(name) for name in (
        "train_loss", "validation_loss", "validation_perplexity", "epoch", "test_loss", "test_perplexity")),
    default_objective={"metric": "validation_loss", "goal": "minimize"},
    distributions=("none", "ddp", "fsdp", "pipeline"),
    check=_check,
    layer_count=layer_count,
)


# --- model ---------------------------------------------------------------------------------
@functools.cache
def _layer_classes() -> tuple[type, type, type]:
    """(TokenEmbedding, TransformerBlock, LanguageModelHead), defined once torch is wanted."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class TokenEmbedding(nn.Module):
        def __init__(self, vocabulary_size: int, dim: int, context_length: int, dropout: float) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocabulary_size, dim)
            self.positions = nn.Embedding(context_length, dim)
            self.dropout = nn.Dropout(dropout)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(ids.shape[-1], device=ids.device)
            return self.dropout(self.tokens(ids) + self.positions(positions))

    class TransformerBlock(nn.Module):
        """Pre-norm causal self-attention and MLP, each with a residual connection."""

        def __init__(self, dim: int, heads: int, dropout: float) -> None:
            super().__init__()
            self.heads = heads
            self.attention_norm = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.projection = nn.Linear(dim, dim)
            self.mlp_norm = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, length, dim = x.shape
            q, k, v = self.qkv(self.attention_norm(x)).split(dim, dim=-1)
            q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.dropout(self.projection(attended.transpose(1, 2).reshape(batch, length, dim)))
            return x + self.dropout(self.mlp(self.mlp_norm(x)))

    class LanguageModelHead(nn.Module):
        def __init__(self, dim: int, vocabulary_size: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.output = nn.Linear(dim, vocabulary_size)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.output(self.norm(x))

    return TokenEmbedding, TransformerBlock, LanguageModelHead


def build_layers(config: dict[str, Any]) -> list[nn.Module]:
    """[embedding block, transformer block × layers, head]: ids (B, T) → logits (B, T, V).
    `config` is config.json's "architecture"."""
    embedding, block, head = _layer_classes()
    size, dim = config["vocabulary_size"], config["embedding_dim"]
    return [
        embedding(size, dim, config["context_length"], config["dropout"]),
        *(block(dim, config["heads"], config["dropout"]) for _ in range(config["layers"])),
        head(dim, size),
    ]


def layer_names(config: dict[str, Any]) -> list[str]:
    """A name per item of build_layers(config), for the pipeline's partition report."""
    return ["embedding", *(f"block {number}" for number in range(1, config["layers"] + 1)), "head"]


def build_model(architecture: dict[str, Any]) -> nn.Module:
    from torch import nn

    return nn.Sequential(*build_layers(architecture))


# --- text ----------------------------------------------------------------------------------
def read_text(folder: Path, channel: str) -> str:
    from algorithms.channels import data_files
    from trainyard.data import iter_lines, read_manifest

    if read_manifest(folder) is not None:  # stream mode: records straight from the object store
        return "".join(iter_lines(folder)).replace("\r\n", "\n")
    parts = []
    for path in data_files(folder, (".txt",), channel):
        try:
            parts.append(path.read_text(encoding="utf-8-sig").replace("\r\n", "\n"))
        except UnicodeDecodeError as exc:
            raise DataError(f"{channel}/{path.relative_to(folder).as_posix()} is not UTF-8 text (byte {exc.start})") from None
    # Files are joined by a line break so one file's last word never runs into the next's first.
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


def encode_text(text: str, vocabulary: str) -> np.ndarray:
    index = {character: position + 1 for position, character in enumerate(vocabulary)}
    return np.array([index.get(character, UNKNOWN) for character in text], dtype=np.int64)


def windows(ids: np.ndarray, context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping (inputs, next-character targets) windows of context_length."""
    count = (len(ids) - 1) // context_length
    inputs = ids[:count * context_length].reshape(count, context_length)
    targets = ids[1:count * context_length + 1].reshape(count, context_length)
    return inputs, targets


def generate(model: nn.Module, schema: dict[str, Any], prompt: str, max_new_tokens: int = 200,
             temperature: float = 1.0, seed: int | None = None) -> str:
    """The characters that follow prompt (not the prompt itself). temperature 0 = greedy;
    a seed makes sampling repeatable."""
    import torch

    vocabulary, context_length = schema["vocabulary"], schema["context_length"]
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be ≥ 0")
    if temperature < 0:
        raise ValueError("temperature must be ≥ 0")
    # An empty prompt starts as if after a line break: the start of a paragraph.
    ids = encode_text(prompt or "\n", vocabulary).tolist()
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    produced: list[str] = []
    model.eval()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids[-context_length:]]))[0, -1]
            logits[UNKNOWN] = float("-inf")  # never emit a character the model cannot name
            if temperature == 0:
                choice = int(logits.argmax())
            else:
                probabilities = torch.softmax(logits / temperature, dim=-1)
                choice = int(torch.multinomial(probabilities, 1, generator=generator))
            ids.append(choice)
            produced.append(vocabulary[choice - 1])
    return "".join(produced)


# --- training ------------------------------------------------------------------------------
def train(ctx: Context) -> None:
    """1. Read every .txt file; the vocabulary is train's characters. 2. Cut the text into
    windows; without a validation channel hold out a seeded 10% of them. 3. Fit (replicated,
    sharded or as a pipeline, as the job's distribution says), write model/ (rank 0)."""
    import torch

    from algorithms.channels import holdout_split, optional_channel, required_channel
    from algorithms.output import save_model
    from algorithms.training import fit
    from trainyard.parallel.steps import Task, TensorBatches

    hps = ctx.hps
    context_length = hps["context_length"]
    text = read_text(required_channel(ctx, "train"), "train")
    vocabulary = "".join(sorted(set(text)))
    inputs, targets = windows(encode_text(text, vocabulary), context_length)
    validation_folder = optional_channel(ctx, "validation")
    minimum = 1 if validation_folder else 2
    if len(inputs) < minimum:
        raise DataError(f"train has {len(text)} characters: char-lm needs at least {minimum * context_length + 1} "
                        f"with context_length {context_length}")
    if validation_folder is None:
        keep, held = holdout_split(len(inputs), hps["seed"])
        validation: tuple[np.ndarray, np.ndarray] | None = (inputs[held], targets[held])
        inputs, targets = inputs[keep], targets[keep]
        ctx.log(f"no validation channel: held out {len(held)} of train's windows (seed {hps['seed']})")
    else:
        validation = windows(encode_text(read_text(validation_folder, "validation"), vocabulary), context_length)
        if len(validation[0]) == 0:
            validation = None
            ctx.log(f"validation text is shorter than context_length {context_length}: no validation metrics")
    test_folder = optional_channel(ctx, "test")
    test = windows(encode_text(read_text(test_folder, "test"), vocabulary), context_length) if test_folder else None

    def tensors(pair: tuple[np.ndarray, np.ndarray] | None) -> TensorBatches | None:
        if pair is None or len(pair[0]) == 0:
            return None
        return TensorBatches(torch.from_numpy(np.ascontiguousarray(pair[0])),
                                    torch.from_numpy(np.ascontiguousarray(pair[1])))

    architecture = {"vocabulary_size": len(vocabulary) + 1, "context_length": context_length,
                    "embedding_dim": hps["embedding_dim"], "layers": hps["layers"], "heads": hps["heads"],
                    "dropout": hps["dropout"]}
    ctx.log(f"{len(text)} train characters, {len(vocabulary)} distinct, {len(inputs)} windows of {context_length}")
    model = build_model(architecture)
    ctx.log(f"model: {sum(parameter.numel() for parameter in model.parameters())} parameters")
    train_data = tensors((inputs, targets))
    assert train_data is not None
    task = Task(model=model, train=train_data, validation=tensors(validation), test=tensors(test),
                       report="perplexity")
    if ctx.distribution == "pipeline":
        from trainyard.parallel import stages

        metrics, weights = stages.fit(ctx, task, list(model.children()), layer_names(architecture))
    elif ctx.distribution == "fsdp":
        from trainyard.parallel.fsdp import FullyShard

        strategy = FullyShard(ctx)
        metrics = fit(ctx, task, strategy)
        weights = strategy.model_state(model)  # every rank takes part in the gather
    else:
        metrics, weights = fit(ctx, task), None
    schema = {"vocabulary": vocabulary, "context_length": context_length}
    save_model(ctx, model, architecture=architecture, input_schema=schema, labels=None, metrics=metrics,
                      weights=weights)


def main() -> None:
    from algorithms.process import run_algorithm

    run_algorithm(SPEC, train)


if __name__ == "__main__":
    main()
