"""The store layer every bucket source reads through (sources/store.py), on a real S3 API."""

from __future__ import annotations

import pickle

import pytest

from stoker.errors import ObjectChanged, SourceError
from stoker.sources.store import ObjectFile, StorageOptions, open_store, shown


@pytest.mark.timeout(120)
def test_store_lists_reads_ranges_and_refuses_an_object_replaced_after_listing(s3_bucket, s3_env):
    client = s3_env.client()
    client.put_object(Bucket=s3_bucket, Key="p/a.bin", Body=b"0123456789")
    client.put_object(Bucket=s3_bucket, Key="p/q/b.bin", Body=b"abc")
    store = open_store(f"s3://{s3_bucket}/p")
    listing = store.list(f"s3://{s3_bucket}/p/")
    assert [(e.url, e.size) for e in listing] == [
        (f"s3://{s3_bucket}/p/a.bin", 10),
        (f"s3://{s3_bucket}/p/q/b.bin", 3),
    ]
    a = listing[0]
    assert store.get(a.url, 2, 5, a.tag) == b"234"
    assert pickle.loads(pickle.dumps(store)).get(a.url, 0, 10, a.tag) == b"0123456789"
    f = ObjectFile(store, a, block=4)
    f.seek(-3, 2)
    assert f.read() == b"789"
    client.put_object(Bucket=s3_bucket, Key="p/a.bin", Body=b"9876543210")  # same size
    with pytest.raises(ObjectChanged, match=f"s3://{s3_bucket}/p/a.bin: the object was replaced"):
        store.get(a.url, 2, 5, a.tag)
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/p/gone.bin: not found"):
        store.get(f"s3://{s3_bucket}/p/gone.bin")


@pytest.mark.timeout(60)
def test_a_bucket_that_does_not_exist_is_one_clear_error(s3_env):
    store = open_store("s3://no-such-bucket-here/x")
    with pytest.raises(SourceError, match="bucket 'no-such-bucket-here' does not exist.*endpoint"):
        store.list("s3://no-such-bucket-here/x")


def test_no_credential_is_shown_or_printed():
    assert shown("https://user:pw@host:8/a/b.jpg?X-Amz-Signature=s3cr3t") == (
        "https://host:8/a/b.jpg?<query hidden>"
    )
    options = StorageOptions({"key": "AKIA", "secret": "s3cr3t"})
    assert "s3cr3t" not in repr(options) and "AKIA" not in repr(options)
    assert "s3cr3t" not in repr(open_store("s3://b/x", {"secret": "s3cr3t"}))
