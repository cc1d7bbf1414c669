"""A dataset version's files read back through the API: the listing, one
file, all of them as a zip; streamed in chunks from a file:// store, a presigned redirect
from S3 (moto's server over real HTTP); readers may download, outsiders get 404, and no
path escapes the version's root."""

from __future__ import annotations

import io
import os
import uuid
import zipfile
from pathlib import Path

import pytest
import requests
from django.test import Client

from datasets.actions import VersionOptions, register_local_files
from datasets.storage import CHUNK

TRAIN = b"f1,f2,label\n" + b"".join(f"{i * 0.1:.1f},{i},{'xy'[i % 2]}\n".encode() for i in range(200))
VALIDATION = b"f1,f2,label\n0.1,1,x\n0.2,2,y\n"


@pytest.fixture
def version(project, owner, tmp_path: Path):
    files = {}
    for rel, body in {"train/train.csv": TRAIN, "validation/validation.csv": VALIDATION,
                      "notes/big #1 é.bin": os.urandom(3 * CHUNK + 17)}.items():
        local = tmp_path / rel.replace("/", "_")
        local.write_bytes(body)
        files[rel] = local
    made, created = register_local_files(project=project, name="toys", description="", user=owner, files=files,
                                         options=VersionOptions(format="csv", label_column="label"))
    assert created
    made.local_bytes = {rel: path.read_bytes() for rel, path in files.items()}
    return made


def body_of(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_listing_gives_every_file_with_a_working_download_url(viewer, client_for, version):
    client = client_for(viewer)  # a viewer may read what the project holds
    response = client.get(f"/api/v1/dataset-versions/{version.pk}/files/")
    assert response.status_code == 200, response.content
    rows = response.json()["results"]
    assert [row["path"] for row in rows] == sorted(version.local_bytes)
    for row in rows:
        download = client.get(row["download_url"])
        assert download.status_code == 200, (row, download.content[:200])
        assert body_of(download) == version.local_bytes[row["path"]]
        assert download["Content-Disposition"].startswith("attachment")


def test_a_large_file_is_streamed_in_chunks_not_read_whole(owner, client_for, version):
    path = "notes/big #1 é.bin"
    [row] = [r for r in client_for(owner).get(f"/api/v1/dataset-versions/{version.pk}/files/").json()["results"]
             if r["path"] == path]
    response = client_for(owner).get(row["download_url"])
    assert response.status_code == 200 and response.streaming
    chunks = list(response.streaming_content)
    assert len(chunks) >= 4 and max(len(chunk) for chunk in chunks) <= CHUNK
    assert b"".join(chunks) == version.local_bytes[path]
    assert response["Content-Length"] == str(len(version.local_bytes[path]))


@pytest.mark.parametrize("bad", ["../train/train.csv", "train/../../../etc/passwd", "./train/train.csv",
                                 "train//train.csv", "train/./train.csv", "%2e%2e/%2e%2e/etc/passwd"])
def test_a_path_that_would_leave_the_version_is_a_400_naming_path(owner, client_for, version, bad):
    response = client_for(owner).get(f"/api/v1/dataset-versions/{version.pk}/files/{bad}")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["path"]


def test_an_unknown_path_is_404_and_another_versions_file_is_not_reachable(owner, client_for, version, project,
                                                                            tmp_path):
    other_local = tmp_path / "secret.csv"
    other_local.write_bytes(b"a,label\n1,x\n")
    other, _ = register_local_files(project=project, name="other", description="", user=owner,
                                    files={"secret.csv": other_local},
                                    options=VersionOptions(format="csv", label_column="label"))
    client = client_for(owner)
    assert client.get(f"/api/v1/dataset-versions/{version.pk}/files/secret.csv").status_code == 404
    assert client.get(f"/api/v1/dataset-versions/{version.pk}/files/train").status_code == 404  # a folder
    assert client.get(f"/api/v1/dataset-versions/{other.pk}/files/secret.csv").status_code == 200


def test_outsiders_and_reviewers_get_404_everywhere(outsider, reviewer, client_for, version):
    for user in (outsider, reviewer):
        client = client_for(user)
        for url in (f"/api/v1/dataset-versions/{version.pk}/files/",
                    f"/api/v1/dataset-versions/{version.pk}/files/train/train.csv",
                    f"/api/v1/dataset-versions/{version.pk}/download"):
            response = client.get(url)
            assert response.status_code == 404, (user.username, url, response.status_code)
            assert response.json()["error"]["code"] == "not_found"
    assert Client().get(f"/api/v1/dataset-versions/{version.pk}/download").status_code in (401, 403)


def test_the_zip_holds_every_file_byte_for_byte_and_is_streamed(viewer, client_for, version):
    response = client_for(viewer).get(f"/api/v1/dataset-versions/{version.pk}/download")
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/zip"
    assert 'filename="toys-v1.zip"' in response["Content-Disposition"]
    chunks = list(response.streaming_content)
    assert len(chunks) >= 4  # produced as it is read, not assembled whole first
    archive = zipfile.ZipFile(io.BytesIO(b"".join(chunks)))
    assert archive.testzip() is None
    assert {name: archive.read(name) for name in archive.namelist()} == version.local_bytes


def test_the_dataset_page_links_each_file_and_the_zip(viewer, version):
    client = Client()
    client.force_login(viewer)
    body = client.get(f"/datasets/{version.dataset_id}/").content.decode()
    assert f'href="/api/v1/dataset-versions/{version.pk}/download"' in body
    assert f'href="/api/v1/dataset-versions/{version.pk}/files/train/train.csv"' in body
    assert f'href="/api/v1/dataset-versions/{version.pk}/files/notes/big%20%231%20%C3%A9.bin"' in body


# --- S3 ------------------------------------------------------------------------------------
@pytest.fixture
def s3_version(owner, client_for, s3):
    bucket = f"bucket-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="sets/toys/train.csv", Body=TRAIN)
    s3.put_object(Bucket=bucket, Key="sets/toys/images/a \"q\".png", Body=b"\x89PNG fake")
    response = client_for(owner).post("/api/v1/datasets/", {"project": "acme", "name": "s3-toys",
                                                            "source_uri": f"s3://{bucket}/sets/toys"}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_an_s3_file_is_a_redirect_to_a_presigned_link_with_the_bytes(viewer, client_for, s3_version, settings):
    client = client_for(viewer)
    rows = client.get(f"/api/v1/dataset-versions/{s3_version['id']}/files/").json()["results"]
    assert sorted(row["path"] for row in rows) == ['images/a "q".png', "train.csv"]
    for row in rows:
        response = client.get(row["download_url"])
        assert response.status_code == 302, response.content
        link = response["Location"]
        assert "Signature=" in link and link.startswith(settings.AWS_ENDPOINT_URL)
        fetched = requests.get(link, timeout=10)
        assert fetched.status_code == 200
        assert fetched.content == (TRAIN if row["path"] == "train.csv" else b"\x89PNG fake")
        assert fetched.headers["Content-Disposition"].startswith("attachment")
    assert requests.get(link.split("?")[0], timeout=10).status_code == 403  # the signature is what opens it


def test_an_s3_version_zips_from_the_bucket(owner, client_for, s3_version):
    response = client_for(owner).get(f"/api/v1/dataset-versions/{s3_version['id']}/download")
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(body_of(response)))
    assert archive.read("train.csv") == TRAIN and archive.read('images/a "q".png') == b"\x89PNG fake"
