"""Load a trained built-in model from its model/ folder and predict with it: what hosting
(endpoints, batch prediction, review's confidence routing) calls.

    predictor = load_predictor(model_dir)
    predictor.predict([{"feature_01": 0.3, ...}])  # classifiers
    → [{"label": "alpine", "confidence": 0.97, "probabilities": {"alpine": 0.97, ...}}]
    predictor.generate("The old train", max_new_tokens=80, temperature=0.8, seed=1)  # char-lm

Each algorithm module knows how to rebuild its model (build_model) and encode raw records
(make_encoder) from config.json; this module only dispatches and does the softmax.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from algorithms import entry_module

MAX_RECORDS = 10_000  # one call; larger batches are the caller's to split


class ClassifierPredictor:
    def __init__(self, model: nn.Module, labels: list[str], encode: Any, config: dict[str, Any]) -> None:
        self.model = model.eval()
        self.labels = labels
        self.encode = encode
        self.config = config

    @property
    def algorithm(self) -> str:
        return self.config["algorithm"]

    def logits(self, records: list[Any]) -> torch.Tensor:
        """The model's raw scores, (records, labels) float32: what an evaluation fits a
        temperature on. ValueError (with a message fit for a 400 response) when a record
        cannot be encoded."""
        if not isinstance(records, list):
            raise ValueError(f"records must be a list, got {type(records).__name__}")
        if len(records) > MAX_RECORDS:
            raise ValueError(f"at most {MAX_RECORDS} records per call, got {len(records)}")
        if not records:
            return torch.empty((0, len(self.labels)))
        inputs = self.encode(records)
        with torch.no_grad():
            return self.model(inputs).float()

    def predict(self, records: list[Any], calibration: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """One {"label", "confidence", "probabilities"} per record, in order.

        `calibration` is a model version's (hosting): {"method": "temperature",
        "temperature": T} divides the logits by T before the softmax; {"method":
        "isotonic", "x": [...], "y": [...]} maps the top probability through the fitted
        steps and rescales the others to fill the rest. Neither changes the label."""
        scores = self.logits(records)
        if not records:
            return []
        method = (calibration or {}).get("method")
        temperature = float((calibration or {}).get("temperature") or 1.0) if method == "temperature" else 1.0
        # Uncalibrated: float32 as ever; calibrated: in float64, so a large T loses nothing.
        probabilities = torch.softmax(scores if method is None else scores.double() / temperature, dim=-1)
        winners = probabilities.argmax(dim=-1).tolist()  # the label never depends on calibration
        if method == "isotonic":
            probabilities = isotonic_top(probabilities, calibration or {})
        results = []
        for best, row in zip(winners, probabilities.tolist(), strict=True):
            results.append({"label": self.labels[best], "confidence": row[best],
                            "probabilities": dict(zip(self.labels, row, strict=True))})
        return results


def isotonic_top(probabilities: torch.Tensor, mapping: dict[str, Any]) -> torch.Tensor:
    """Top-label isotonic calibration: the winning class's probability becomes the fitted
    step function's value (np.interp over mapping's x and y, clipped at the ends) and the
    other classes share the rest in their old proportions. The caller keeps the label it
    had before: a confidence mapped low may leave another class's share above it."""
    import numpy as np

    top, index = probabilities.max(dim=-1)
    mapped = torch.from_numpy(np.interp(top.numpy(), mapping["x"], mapping["y"])).to(probabilities.dtype)
    mapped = mapped.clamp(1e-12, 1.0)
    rest = (1.0 - top).clamp_min(1e-12)
    scaled = probabilities * ((1.0 - mapped) / rest).unsqueeze(-1)
    scaled.scatter_(-1, index.unsqueeze(-1), mapped.unsqueeze(-1))
    return scaled


class CharLMPredictor:
    def __init__(self, model: nn.Module, config: dict[str, Any]) -> None:
        self.model = model.eval()
        self.config = config

    @property
    def algorithm(self) -> str:
        return self.config["algorithm"]

    def generate(self, prompt: str, max_new_tokens: int = 200, temperature: float = 1.0, seed: int | None = None) -> str:
        """The text that continues prompt (without the prompt)."""
        from algorithms.charlm import generate

        return generate(self.model, self.config["input"], prompt, max_new_tokens, temperature, seed)

    def predict(self, records: list[Any]) -> list[dict[str, Any]]:
        """Generation for record-shaped callers: each record is a prompt, or an object with
        "prompt" and optional "max_new_tokens", "temperature", "seed"."""
        results = []
        for record in records:
            options = record if isinstance(record, dict) else {"prompt": record}
            if not isinstance(options.get("prompt", ""), str):
                raise ValueError("a char-lm record is a prompt string or an object with a 'prompt' string")
            text = self.generate(options.get("prompt", ""), int(options.get("max_new_tokens", 200)),
                                 float(options.get("temperature", 1.0)), options.get("seed"))
            results.append({"text": text})
        return results


Predictor = ClassifierPredictor | CharLMPredictor


def read_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json: not a model written by a built-in algorithm")
    return json.loads(path.read_text(encoding="utf-8"))


def load_predictor(model_dir: str | os.PathLike[str]) -> Predictor:
    """Rebuild the model from config.json, load model.safetensors into it (strictly: a
    mismatch is an error, not silently random weights) and pair it with its encoder."""
    from safetensors.torch import load_file

    folder = Path(model_dir)
    config = read_config(folder)
    try:
        module = importlib.import_module(entry_module(config.get("algorithm", "")))
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    model = module.build_model(config["architecture"])
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    model.eval()
    if config["algorithm"] == "char-lm":
        return CharLMPredictor(model, config)
    label_map = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    labels = [label_map[str(index)] for index in range(len(label_map))]
    return ClassifierPredictor(model, labels, module.make_encoder(config), config)
