"""S3 sources and the S3 object store, over real HTTP to moto's server on loopback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from datasets.storage import MULTIPART_THRESHOLD, S3Store, StorageError
from datasets.validation_run import run_validation

CSV = b"f1,f2,label\n0.1,1,x\n0.2,2,y\n0.3,3,x\n"


@pytest.fixture
def bucket(s3) -> str:
    name = f"bucket-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    return name


def register(client, uri: str, name: str = "from-s3"):
    return client.post("/api/v1/datasets/", {"project": "acme", "name": name, "source_uri": uri}, format="json")


def test_s3_prefix_registers_and_validates(owner, client_for, s3, bucket):
    s3.put_object(Bucket=bucket, Key="sets/iris/train.csv", Body=CSV)
    s3.put_object(Bucket=bucket, Key="sets/iris/validation.csv", Body=CSV)
    s3.put_object(Bucket=bucket, Key="sets/iris-other/train.csv", Body=b"nope\n")
    response = register(client_for(owner), f"s3://{bucket}/sets/iris")
    assert response.status_code == 201, response.content
    body = response.json()
    assert sorted(f["path"] for f in body["files"]) == ["train.csv", "validation.csv"]
    assert run_validation(body["id"]) == "ready"
    again = register(client_for(owner), f"s3://{bucket}/sets/iris")
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]


def test_changed_s3_object_makes_a_new_version(owner, client_for, s3, bucket):
    s3.put_object(Bucket=bucket, Key="d/train.csv", Body=CSV)
    first = register(client_for(owner), f"s3://{bucket}/d/").json()
    s3.put_object(Bucket=bucket, Key="d/train.csv", Body=CSV + b"0.4,4,y\n")
    second = register(client_for(owner), f"s3://{bucket}/d/")
    assert second.status_code == 201
    assert second.json()["version"] == first["version"] + 1


def test_missing_bucket_is_a_field_error(owner, client_for, s3):
    response = register(client_for(owner), "s3://no-such-bucket-here/data")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["fields"]["source_uri"] == ["bucket 'no-such-bucket-here' does not exist"]


def test_empty_prefix_is_a_field_error(owner, client_for, bucket):
    response = register(client_for(owner), f"s3://{bucket}/nothing-here/")
    assert response.status_code == 400
    assert "no files found" in response.json()["error"]["message"]


def test_no_credentials_is_a_clear_field_error(owner, client_for, s3, bucket, monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    response = register(client_for(owner), f"s3://{bucket}/x")
    assert response.status_code == 400
    assert "no S3 credentials" in response.json()["error"]["message"]


def test_s3_store_round_trip_multipart_and_presigned_link(s3, bucket, tmp_path: Path):
    store = S3Store()
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x01" * (MULTIPART_THRESHOLD + 1024 * 1024))
    uri = f"s3://{bucket}/objects/big.bin"
    store.put_file(big, uri)
    head = s3.head_object(Bucket=bucket, Key="objects/big.bin")
    assert head["ContentLength"] == big.stat().st_size
    assert "-" in head["ETag"]  # a multipart upload's ETag ends in -<parts>
    with store.open_write(f"s3://{bucket}/objects/small.txt") as out:
        out.write(b"hello")
    with store.open_read(f"s3://{bucket}/objects/small.txt") as body:
        assert body.read() == b"hello"
    url = store.presigned_url(f"s3://{bucket}/objects/small.txt")
    import urllib.request

    with urllib.request.urlopen(url) as response:  # noqa: S310 - loopback moto server
        assert response.read() == b"hello"
    listed = sorted(o.relative_path for o in store.list(f"s3://{bucket}/objects/"))
    assert listed == ["big.bin", "small.txt"]
    store.delete_prefix(f"s3://{bucket}/objects/")
    assert list(store.list(f"s3://{bucket}/objects/")) == []


def test_s3_read_of_missing_key_says_so(s3, bucket):
    with pytest.raises(StorageError, match="does not exist"):
        S3Store().open_read(f"s3://{bucket}/missing.csv")
