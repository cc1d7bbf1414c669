from __future__ import annotations

from pathlib import Path

import pytest

from datasets.storage import LocalStore, StorageError, object_uri, split_uri, store_for


def test_local_store_refuses_keys_that_leave_the_root(tmp_path: Path):
    store = LocalStore(tmp_path / "root")
    (tmp_path / "root").mkdir()
    for key in ("../escape.txt", "a/../../escape.txt", "/etc/passwd"):
        with pytest.raises(StorageError):
            store.key_path(key)
    with pytest.raises(StorageError, match="outside the allowed root"):
        store.path_for((tmp_path / "root" / ".." / "x").as_uri())


def test_local_store_refuses_a_symlink_out(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(StorageError, match="outside the allowed root"):
        LocalStore(root).path_for((root / "link" / "f.csv").as_uri())


def test_local_write_is_atomic(tmp_path: Path):
    store = LocalStore(tmp_path)
    uri = (tmp_path / "a" / "b.bin").as_uri()
    with pytest.raises(RuntimeError), store.open_write(uri) as out:
        out.write(b"partial")
        raise RuntimeError("crash mid-write")
    assert not (tmp_path / "a" / "b.bin").exists()
    assert list((tmp_path / "a").iterdir()) == []
    with store.open_write(uri) as out:
        out.write(b"whole")
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"whole"


def test_store_for_refuses_paths_outside_every_root(db):
    with pytest.raises(StorageError, match="not under an allowed data root"):
        store_for("file:///etc/passwd")


def test_object_uri_refuses_dotdot():
    with pytest.raises(StorageError):
        object_uri("uploads/../../etc")


def test_split_uri_messages():
    assert split_uri("s3://b/k/x") == ("s3", "b", "k/x")
    with pytest.raises(StorageError, match="needs a bucket"):
        split_uri("s3:///k")
    with pytest.raises(StorageError, match="unsupported scheme"):
        split_uri("ftp://x/y")
