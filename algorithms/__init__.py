"""The built-in algorithms: name → spec (schema, metric definitions, entry module).

Specs load on first use, not at package import: a training process starts with
`python -m algorithms.tabular`, which imports this package first, and importing
tabular here too would run that module twice (runpy warns about exactly that). Reading
the specs is cheap: algorithm modules import torch only inside their functions, so the
web server pays no torch import (tests/algorithms/test_hyperparameter_schema.py checks).
"""

from __future__ import annotations

import importlib
from typing import Any

from algorithms.base import AlgorithmSpec, Hyperparameter, validate_hyperparameters

# name → module; the order is the order the job form lists them in.
ENTRY_MODULES: dict[str, str] = {
    "tabular-classifier": "algorithms.tabular",
    "image-classifier": "algorithms.image",
    "text-classifier": "algorithms.text",
    "char-lm": "algorithms.charlm",
}
_loaded: dict[str, AlgorithmSpec] = {}


def _algorithms() -> dict[str, AlgorithmSpec]:
    if not _loaded:
        for name, module in ENTRY_MODULES.items():
            spec = importlib.import_module(module).SPEC
            if spec.name != name or spec.module != module:
                raise RuntimeError(f"{module}.SPEC is named {spec.name!r} (module {spec.module!r}), registered as {name!r}")
            _loaded[name] = spec
    return _loaded


def __getattr__(attribute: str) -> Any:
    # `from algorithms import ALGORITHMS` lands here (PEP 562) and loads the specs.
    if attribute == "ALGORITHMS":
        return _algorithms()
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


ALGORITHMS: dict[str, AlgorithmSpec]  # for type checkers; the value comes from __getattr__


def get_algorithm(name: str) -> AlgorithmSpec | None:
    return _algorithms().get(name)


def entry_module(name: str) -> str:
    """The module torch.distributed.run runs with -m for this algorithm; KeyError if unknown."""
    if name not in ENTRY_MODULES:
        raise KeyError(f"unknown algorithm {name!r}; built-in algorithms are {', '.join(ENTRY_MODULES)}")
    return ENTRY_MODULES[name]


__all__ = ["ALGORITHMS", "ENTRY_MODULES", "AlgorithmSpec", "Hyperparameter", "entry_module", "get_algorithm",
           "validate_hyperparameters"]
