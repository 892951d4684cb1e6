"""``s3://`` through obstore (sources/obstores.py): the same listing, bytes and errors as through
s3fs, on the real S3 API of the test server; and which options keep s3fs."""

from __future__ import annotations

import pytest

from stoker.errors import ObjectChanged, SourceError
from stoker.sources import obstores
from stoker.sources.store import open_store

pytest.importorskip("obstore")
pytest.importorskip("s3fs")

S3FS_ONLY = {"config_kwargs": {"max_pool_connections": 4}}  # an option obstore has no word for


@pytest.mark.timeout(120)
def test_obstore_reads_the_same_listing_bytes_and_errors_as_s3fs(s3_bucket, s3_env):
    client = s3_env.client()
    objects = {"d/a.bin": bytes(range(256)) * 40, "d/e/b.jpg": b"\xff\xd8" + b"x" * 999, "d/c": b""}
    for key, body in objects.items():
        client.put_object(Bucket=s3_bucket, Key=key, Body=body)
    client.put_object(Bucket=s3_bucket, Key="dx/not-below-d", Body=b"1")
    url = f"s3://{s3_bucket}/d"
    fast, standard = open_store(url), open_store(url, S3FS_ONLY)
    assert (fast.backend, standard.backend) == ("obstore", "s3fs")
    listing = fast.list(url + "/")
    assert listing == standard.list(url + "/")
    assert [e.url.split("/", 3)[3] for e in listing] == sorted(objects)
    top = fast.list(url + "/", recursive=False)
    assert top == standard.list(url + "/", recursive=False)
    assert [e.url.split("/", 3)[3] for e in top] == ["d/a.bin", "d/c"]
    for entry in listing:
        assert fast.head(entry.url) == standard.head(entry.url) == entry
        assert fast.get(entry.url, tag=entry.tag) == objects[entry.url.split("/", 3)[3]]
    a = listing[0]
    for start, end in ((0, 1), (100, 5000), (10_239, 10_240)):
        assert fast.get(a.url, start, end, a.tag) == standard.get(a.url, start, end, a.tag)
        assert fast.get(a.url, start, end) == objects["d/a.bin"][start:end]
    client.put_object(Bucket=s3_bucket, Key="d/a.bin", Body=b"new bytes")
    for store in (fast, standard):
        with pytest.raises(ObjectChanged, match=f"{a.url}: the object was replaced"):
            store.get(a.url, 0, 4, a.tag)
        with pytest.raises(FileNotFoundError, match=f"{url}/gone: not found"):
            store.get(f"{url}/gone")
        with pytest.raises(SourceError, match="not found"):
            store.head(f"{url}/gone")
    for store in (
        open_store("s3://no-such-bucket-9/x"),
        open_store("s3://no-such-bucket-9", S3FS_ONLY),
    ):
        with pytest.raises(SourceError, match="bucket 'no-such-bucket-9' does not exist"):
            store.list("s3://no-such-bucket-9/x")


def test_obstore_takes_the_options_it_understands_and_leaves_the_rest_to_s3fs(tmp_path):
    env = {"HOME": str(tmp_path)}
    options = {
        "endpoint_url": "http://127.0.0.1:9",
        "key": "AK",
        "secret": "SK",
        "token": "T",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert obstores.s3_config(options, env) == {
        "endpoint": "http://127.0.0.1:9",
        "region": "eu-west-1",
        "access_key_id": "AK",
        "secret_access_key": "SK",
        "session_token": "T",
    }
    assert obstores.s3_config({"anon": True}, env) == {"skip_signature": True}
    assert obstores.s3_config({}, env) == {}
    assert obstores.s3_config(S3FS_ONLY, env) is None
    assert obstores.s3_config({"client_kwargs": {"verify": False}}, env) is None
    # obstore reads no AWS profile: a profile, or a credentials file with no key set, is s3fs's
    assert obstores.s3_config({}, {**env, "AWS_PROFILE": "dev"}) is None
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert obstores.s3_config({}, env) is None
    assert obstores.s3_config({}, {**env, "AWS_ACCESS_KEY_ID": "AK"}) == {}
    assert obstores.s3_config({"key": "AK", "secret": "SK"}, env) is not None
