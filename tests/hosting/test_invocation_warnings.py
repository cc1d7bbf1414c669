"""An invocation with a categorical value the model never saw in training
still predicts (encoded as none of the known values), and the response says so in
`warnings`, naming the instance, the column and the known values."""

from __future__ import annotations

from tests.hosting.conftest import features, held_rows
from tests.hosting.test_endpoints import endpoint, invoke, model_version  # noqa: F401 - fixtures


def test_unknown_category_is_named_in_warnings(owner, client_for, endpoint, demo_model_artifact):  # noqa: F811
    categorical = endpoint.model_version.input_schema["categorical"]
    assert categorical, "the demo table has a categorical feature"
    column, known = next(iter(categorical.items()))
    row = features(held_rows(demo_model_artifact)[0])
    client = client_for(owner)

    plain = invoke(client, [row])
    assert plain.status_code == 200 and plain.json()["warnings"] == []

    unseen = {**row, column: "never-seen-in-training"}
    result = invoke(client, [row, unseen])
    assert result.status_code == 200, result.content
    assert len(result.json()["predictions"]) == 2
    (warning,) = result.json()["warnings"]
    assert warning.startswith(f"instances[1]: '{column}' = 'never-seen-in-training' is not a value the model saw")
    assert str(known[0]) in warning
