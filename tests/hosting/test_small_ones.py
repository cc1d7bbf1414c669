"""A model version names the data it was trained on ("train:
demo-held-out v1", linked), not a bare id."""

from __future__ import annotations

from django.test import Client

from hosting import actions


def test_model_version_names_its_dataset_versions(owner, demo_job, demo_version):
    version = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    client = Client()
    client.force_login(owner)
    body = client.get(f"/models/{version.model.pk}/").content.decode()
    assert f"{demo_version.dataset.name} v{demo_version.version}</a>" in body
    assert f"?version={demo_version.version}" in body
    assert "train: <span" not in body
