"""What a built-in algorithm leaves in model/: the weights, the config predict.py rebuilds
the model and encodes raw records from, and the labels."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from algorithms.process import Context


def save_model(ctx: Context, model: nn.Module, *, architecture: dict[str, Any], input_schema: dict[str, Any],
               labels: list[str] | None, metrics: dict[str, float], weights: dict[str, torch.Tensor] | None = None) -> None:
    """model/: model.safetensors, config.json (everything predict.py needs to rebuild the
    model and encode raw records) and labels.json (index → label). Rank 0 only. `weights`,
    when the model is split over processes: the whole model's state dict, gathered on rank 0."""
    if not ctx.dist.is_main:
        return
    from safetensors.torch import save_file

    model_dir = ctx.env.model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    state = model.state_dict() if weights is None else weights
    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"algorithm": ctx.spec.name})
    config = {
        "algorithm": ctx.spec.name,
        "format_version": 1,
        "framework": f"torch {torch.__version__}",
        "hyperparameters": ctx.hps,
        "architecture": architecture,
        "input": input_schema,
        "metrics": metrics,
        "world_size": ctx.dist.world_size,
        "distribution": ctx.distribution,
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if labels is not None:
        label_map = {str(index): label for index, label in enumerate(labels)}
        (model_dir / "labels.json").write_text(json.dumps(label_map, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    ctx.log(f"wrote {model_dir}: model.safetensors, config.json" + (", labels.json" if labels is not None else ""))
