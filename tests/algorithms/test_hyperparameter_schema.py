"""The algorithm registry and hyperparameter schemas: what the API validates with and the
job form is generated from. No training here, and no torch needed to read a schema."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from algorithms import ALGORITHMS, entry_module, get_algorithm, validate_hyperparameters
from algorithms.base import AlgorithmSpec, Hyperparameter
from tests.conftest import ROOT

TABULAR = "tabular-classifier"


def test_registry_names_the_four_builtin_algorithms():
    assert list(ALGORITHMS) == ["tabular-classifier", "image-classifier", "text-classifier", "char-lm"]
    assert entry_module("char-lm") == "algorithms.charlm"
    assert entry_module(TABULAR) == "algorithms.tabular"
    assert get_algorithm("xgboost") is None
    with pytest.raises(KeyError, match="unknown algorithm 'xgboost'"):
        entry_module("xgboost")


def test_reading_every_schema_imports_neither_torch_nor_django():
    code = ("import sys, json; from algorithms import ALGORITHMS; "
            "json.dumps([spec.as_json() for spec in ALGORITHMS.values()]); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'django')); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize("name", ["tabular-classifier", "image-classifier", "text-classifier", "char-lm"])
def test_every_spec_serialises_for_the_api_and_the_form(name):
    spec = get_algorithm(name)
    data = json.loads(json.dumps(spec.as_json()))
    assert data["name"] == name and data["title"] and data["description"]
    assert data["channels"] == {"required": ["train"], "optional": ["validation", "test"]}
    hyperparameters = {item["name"]: item for item in data["hyperparameters"]}
    for common in ("epochs", "batch_size", "learning_rate", "seed", "max_steps"):
        assert common in hyperparameters
    assert hyperparameters["seed"]["default"] == 42
    assert set(hyperparameters["epochs"]) == {"name", "type", "default", "min", "max", "choices", "description"}
    assert data["default_objective"]["metric"] in {item["name"] for item in data["metric_definitions"]}
    assert "train_loss" in {item["name"] for item in data["metric_definitions"]}
    # The defaults themselves pass validation.
    clean, errors = validate_hyperparameters(spec, {})
    assert errors == {} and clean == spec.defaults()


def test_strings_that_parse_are_accepted_and_defaults_filled_in():
    spec = get_algorithm(TABULAR)
    clean, errors = validate_hyperparameters(spec, {"epochs": "5", "learning_rate": "0.01", "dropout": 0, "layers": 3.0,
                                                    "label_column": "species", "batch_size": " 16 ", "max_steps": "1e3"})
    assert errors == {}
    assert clean["epochs"] == 5 and isinstance(clean["epochs"], int)
    assert clean["learning_rate"] == 0.01 and clean["dropout"] == 0.0 and clean["layers"] == 3
    assert clean["batch_size"] == 16 and clean["max_steps"] == 1000
    assert clean["label_column"] == "species"
    assert clean["hidden_units"] == 64 and clean["seed"] == 42  # untouched fields keep their defaults


def test_empty_values_mean_the_default():
    clean, errors = validate_hyperparameters(get_algorithm(TABULAR), {"epochs": "", "learning_rate": None})
    assert errors == {} and clean["epochs"] == 10 and clean["learning_rate"] == 0.003


@pytest.mark.parametrize(("values", "field", "message"), [
    ({"epochs": "abc"}, "epochs", "epochs: expected an integer, got 'abc'"),
    ({"epochs": 2.5}, "epochs", "epochs: expected an integer, got 2.5"),
    ({"epochs": True}, "epochs", "epochs: expected an integer, got True"),
    ({"epochs": 0}, "epochs", "epochs: must be ≥ 1, got 0"),
    ({"learning_rate": 2}, "learning_rate", "learning_rate: must be ≤ 1, got 2"),
    ({"learning_rate": "nan"}, "learning_rate", "learning_rate: must be a finite number, got 'nan'"),
    ({"dropout": [0.1]}, "dropout", "dropout: expected a number, got [0.1]"),
    ({"label_column": {"a": 1}}, "label_column", "label_column: expected a string, got {'a': 1}"),
    ({"epoch": 3}, "epoch", "epoch: unknown hyperparameter for tabular-classifier; did you mean 'epochs'?"),
])
def test_bad_values_get_one_clear_message_per_field(values, field, message):
    _, errors = validate_hyperparameters(get_algorithm(TABULAR), values)
    assert errors == {field: message}


def test_every_bad_field_is_reported_at_once():
    _, errors = validate_hyperparameters(get_algorithm(TABULAR), {"epochs": "x", "layers": -1, "colour": "red"})
    assert set(errors) == {"epochs", "layers", "colour"}
    assert errors["colour"].startswith("colour: unknown hyperparameter for tabular-classifier; tabular-classifier takes epochs")


def test_choices_and_booleans():
    text = get_algorithm("text-classifier")
    assert validate_hyperparameters(text, {"token_type": "char"})[0]["token_type"] == "char"
    assert validate_hyperparameters(text, {"token_type": "bpe"})[1] == {"token_type": "token_type: must be one of word, char, got 'bpe'"}
    image = get_algorithm("image-classifier")
    assert validate_hyperparameters(image, {"channels": "1"})[0]["channels"] == 1
    assert validate_hyperparameters(image, {"channels": 2})[1] == {"channels": "channels: must be one of 1, 3, got 2"}
    flag = Hyperparameter("shuffle", "boolean", True)
    assert [flag.coerce(value) for value in ("true", "False", "yes", "0", 1, False)] == [True, False, True, False, True, False]
    with pytest.raises(ValueError, match="shuffle: expected true or false, got 'maybe'"):
        flag.coerce("maybe")


def test_rules_between_fields_are_field_errors():
    _, errors = validate_hyperparameters(get_algorithm("char-lm"), {"embedding_dim": 30, "heads": 4})
    assert errors == {"heads": "heads: must divide embedding_dim (30), got 4"}


def test_training_processes_tolerate_extra_names_the_api_rejects():
    spec = get_algorithm(TABULAR)
    clean, errors = validate_hyperparameters(spec, {"sagemaker_program": "x", "epochs": "2"}, allow_unknown=True)
    assert errors == {} and clean["epochs"] == 2 and "sagemaker_program" not in clean
    assert validate_hyperparameters(spec, "epochs=2")[1] == {
        "hyperparameters": "hyperparameters: expected an object, got 'epochs=2'"}


def test_a_mistake_in_a_spec_fails_at_import_time():
    with pytest.raises(ValueError, match="must be ≤ 1"):
        Hyperparameter("rate", "float", 5.0, max=1.0)
    with pytest.raises(ValueError, match="needs choices"):
        Hyperparameter("kind", "categorical", "a")
    with pytest.raises(ValueError, match="duplicate"):
        AlgorithmSpec(name="x", title="x", description="", module="m", formats=(), metric_definitions=(),
                      default_objective={}, hyperparameters=(Hyperparameter("a", "integer", 1),) * 2)
