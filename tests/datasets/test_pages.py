"""Dataset pages through Django's test client: who sees what, what is escaped, what the
detail page shows for ready and invalid versions, and what the file view refuses."""

from __future__ import annotations

import io
import re
from pathlib import Path

from django.test import Client
from django.urls import reverse

from datasets.models import Dataset, DatasetVersion
from datasets.validation_run import run_validation
from jobs.models import JobInput, TrainingJob
from tests import factories

GOOD_CSV = b"x,y,label\n1,2.5,cat\n2,3.5,dog\n3,4.5,cat\n"
RAGGED_CSV = b"x,y,label\n1,2.5,cat\n2,dog\n3,4.5,cat\n"
XSS = "<script>alert('pwned')</script>"


def make_version(project, user, tmp_path: Path, *, name: str = "iris", files: dict[str, bytes] | None = None,
                 description: str = "", validate: bool = True) -> DatasetVersion:
    """A version created through the real action (and, unless told, validated in-process)."""
    return factories.make_version(project, tmp_path, files if files is not None else {"train.csv": GOOD_CSV}, name=name,
                                  user=user, description=description, validate=validate, must_be_ready=False)


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def png_bytes(colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return buffer.getvalue()


# --- access ---------------------------------------------------------------------------------
def test_dataset_pages_require_login(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path)
    for url in (reverse("dataset-list"), reverse("dataset-upload"), reverse("dataset-detail", args=[version.dataset_id]),
                reverse("dataset-version-status", args=[version.pk]), reverse("dataset-file", args=[version.pk, "train.csv"])):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_outsider_gets_404_everywhere(owner, outsider, project, tmp_path):
    version = make_version(project, owner, tmp_path)
    client = login(outsider)
    assert client.get(reverse("dataset-detail", args=[version.dataset_id])).status_code == 404
    assert client.get(reverse("dataset-version", args=[version.pk])).status_code == 404
    assert client.get(reverse("dataset-version-status", args=[version.pk])).status_code == 404
    assert client.get(reverse("dataset-file", args=[version.pk, "train.csv"])).status_code == 404
    assert client.post(reverse("dataset-version-delete", args=[version.pk])).status_code == 404
    assert "iris" not in client.get(reverse("dataset-list")).content.decode()
    assert DatasetVersion.objects.filter(pk=version.pk).exists()


def test_viewer_sees_no_write_controls_and_gets_403_on_writes(owner, viewer, project, tmp_path):
    version = make_version(project, owner, tmp_path)
    client = login(viewer)
    listing = client.get(reverse("dataset-list")).content.decode()
    assert "iris" in listing
    assert reverse("dataset-upload") not in listing
    detail = client.get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    assert reverse("dataset-version-delete", args=[version.pk]) not in detail
    assert "Upload new version" not in detail
    assert client.get(reverse("dataset-upload")).status_code == 403
    refused = client.post(reverse("dataset-version-delete", args=[version.pk]))
    assert refused.status_code == 403
    assert "viewer" in refused.content.decode()
    assert DatasetVersion.objects.filter(pk=version.pk).exists()


def test_scientist_sees_upload_and_delete(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    client = login(teammate)
    assert reverse("dataset-upload") in client.get(reverse("dataset-list")).content.decode()
    detail = client.get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    assert reverse("dataset-version-delete", args=[version.pk]) in detail


# --- escaping --------------------------------------------------------------------------------
def test_script_in_name_and_description_is_escaped(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path, name=f"evil {XSS}", description=f"about {XSS}\nsecond line")
    client = login(owner)
    for url in (reverse("dataset-list"), reverse("dataset-detail", args=[version.dataset_id]), reverse("overview")):
        body = client.get(url).content.decode()
        assert XSS not in body, url
        assert "&lt;script&gt;alert(" in body, url


def test_script_in_preview_values_and_column_names_is_escaped(owner, project, tmp_path):
    csv = f"x,{XSS},label\n1,{XSS},a\n2,b,c\n".encode()
    version = make_version(project, owner, tmp_path, files={"train.csv": csv})
    assert version.status == "ready", version.errors
    body = login(owner).get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    assert XSS not in body
    # The chart data goes through json_script, which escapes "<" inside the JSON.
    assert "<script id=\"class-chart-data\" type=\"application/json\">" in body


# --- list -------------------------------------------------------------------------------------
def test_list_shows_latest_version_status_records_and_size(owner, project, tmp_path):
    make_version(project, owner, tmp_path, name="iris")
    make_version(project, owner, tmp_path, name="iris", files={"train.csv": GOOD_CSV + b"4,5.5,dog\n"})
    body = login(owner).get(reverse("dataset-list")).content.decode()
    row = re.search(r"<tr>\s*<td><a href=\"/datasets/\d+/\"[^>]*>iris</a>.*?</tr>", body, re.S)
    assert row, body
    assert "v2" in row.group(0)
    assert "badge--green" in row.group(0)
    assert ">4<" in row.group(0)  # records of v2
    assert "<time" in row.group(0) and "title=" in row.group(0)


def test_list_query_count_does_not_grow_with_datasets(owner, project, tmp_path, django_assert_max_num_queries):
    for index in range(12):
        make_version(project, owner, tmp_path, name=f"set-{index}", files={"train.csv": GOOD_CSV + f"9,9,c{index}\n".encode()},
                     validate=False)
    client = login(owner)
    with django_assert_max_num_queries(8):
        response = client.get(reverse("dataset-list"))
    assert response.status_code == 200
    assert response.content.decode().count('data-status="validating"') == 12


def test_list_empty_state_links_to_upload(owner, project):
    body = login(owner).get(reverse("dataset-list")).content.decode()
    assert "No datasets yet" in body
    assert reverse("dataset-upload") in body


# --- detail -----------------------------------------------------------------------------------
def test_detail_of_ready_version_shows_schema_preview_and_chart(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path, description="Flowers")
    assert version.status == "ready", version.errors
    body = login(owner).get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    assert 'id="schema-table"' in body
    assert 'id="preview-table"' in body
    assert "class-chart-data" in body and "plotly.min." in body  # plotly.min.<hash>.js
    assert version.content_hash in body
    assert 'hx-trigger="every' not in body  # nothing to poll once ready (the jobs list loads once)


def test_detail_of_invalid_version_lists_line_errors(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path, name="ragged", files={"train.csv": RAGGED_CSV})
    assert version.status == "invalid"
    body = login(owner).get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    assert 'id="errors-table"' in body
    error = version.errors[0]
    assert error["line"] == 3
    assert error["message"] in body
    assert re.search(r'<td class="num mono">3</td>', body)
    assert "plotly.min." not in body  # charts load only where there is one (hashed name)


def test_detail_picks_a_version_and_404s_on_unknown(owner, project, tmp_path):
    first = make_version(project, owner, tmp_path)
    make_version(project, owner, tmp_path, files={"train.csv": GOOD_CSV + b"4,5.5,dog\n"})
    client = login(owner)
    url = reverse("dataset-detail", args=[first.dataset_id])
    assert '<span class="version-tag">v2</span>' in client.get(url).content.decode()
    assert '<span class="version-tag">v1</span>' in client.get(url + "?version=1").content.decode()
    assert client.get(url + "?version=9").status_code == 404
    assert client.get(url + "?version=abc").status_code == 404


def test_validating_version_polls_and_asks_for_refresh_when_done(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path, validate=False)
    client = login(owner)
    detail = client.get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    status_url = reverse("dataset-version-status", args=[version.pk])
    assert f'hx-get="{status_url}"' in detail and 'hx-trigger="every 1s"' in detail
    fragment = client.get(status_url, headers={"HX-Request": "true"})
    assert fragment.status_code == 200 and "every 1s" in fragment.content.decode()
    run_validation(version.pk)
    done = client.get(status_url, headers={"HX-Request": "true"})
    assert done["HX-Refresh"] == "true"


# --- file view --------------------------------------------------------------------------------
def test_file_view_serves_version_images_and_refuses_other_paths(owner, project, tmp_path, isolated_storage):
    images = {"cat/1.png": png_bytes(), "dog/1.png": png_bytes((20, 20, 200))}
    version = make_version(project, owner, tmp_path, name="pets", files=images)
    assert version.status == "ready", version.errors
    other = make_version(project, owner, tmp_path, name="other")
    client = login(owner)
    served = client.get(reverse("dataset-file", args=[version.pk, "cat/1.png"]))
    assert served.status_code == 200
    assert served["Content-Type"] == "image/png"
    assert b"".join(served.streaming_content) == images["cat/1.png"]
    detail = client.get(reverse("dataset-detail", args=[version.dataset_id])).content.decode()
    assert 'class="thumb"' in detail
    base = reverse("dataset-version", args=[version.pk])
    refused = [
        "train.csv",  # another version's file
        "cat/../dog/1.png", "../" * 6 + "etc/passwd", "%2Fetc%2Fpasswd", "cat/2.png",
        other.files[0]["uri"].removeprefix("file://"),
    ]
    for path in refused:
        assert client.get(f"{base}files/{path}").status_code == 404, path


def test_non_image_files_download_instead_of_rendering(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path)
    response = login(owner).get(reverse("dataset-file", args=[version.pk, "train.csv"]))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"].startswith("attachment")


# --- delete, upload ---------------------------------------------------------------------------
def test_delete_removes_the_version_and_returns_to_the_list(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    client = login(teammate)
    response = client.post(reverse("dataset-version-delete", args=[version.pk]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("dataset-list")
    assert "Deleted iris v1" in response.content.decode()
    assert not Dataset.objects.filter(pk=version.dataset_id).exists()


def test_delete_is_refused_while_a_job_uses_the_version(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    job = TrainingJob.objects.create(project=project, name="j1", created_by=teammate)
    JobInput.objects.create(job=job, channel="train", dataset_version=version)
    response = login(teammate).post(reverse("dataset-version-delete", args=[version.pk]), follow=True)
    assert response.status_code == 200
    assert "used by a training job" in response.content.decode()
    assert DatasetVersion.objects.filter(pk=version.pk).exists()


def test_delete_needs_post(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    assert login(teammate).get(reverse("dataset-version-delete", args=[version.pk])).status_code == 405


def test_upload_page_offers_only_writable_projects(teammate, project, other_project):
    from studio.actions import set_membership

    set_membership(project=other_project, user=teammate, role="viewer")
    body = login(teammate).get(reverse("dataset-upload")).content.decode()
    select = re.search(r'<select name="project"[^>]*id="id_project".*?</select>', body, re.S)
    assert select, body
    assert 'value="acme"' in select.group(0)
    assert 'value="rival"' not in select.group(0)
    assert "webkitdirectory" in body
    assert 'data-max-bytes="' in body


def test_upload_page_prefills_the_name_of_a_dataset(teammate, project):
    body = login(teammate).get(reverse("dataset-upload") + "?project_slug=acme&name=iris").content.decode()
    assert 'value="iris"' in body
