"""Bucket listings (sources/listing.py) on a real S3 API behind the fault proxy: a second Loader
takes the cached listing (no LIST request), a replaced object is refused by name and makes the
next Loader list again, the cache follows cachefile's ownership rules and holds no credential,
and the ranks of a torch.distributed job all take rank 0's listing. LIST requests are counted
at the proxy (a LIST is a GET of the bucket's own path)."""

from __future__ import annotations

import os
import pickle
import stat
import textwrap

import numpy as np
import pytest

import stoker
from faultproxy import FaultProxy
from helpers import run_ranks
from stoker.sources import listing
from stoker.sources.bucketfiles import lookup
from stoker.sources.store import Entry, open_store

pytest.importorskip("s3fs")

KW = {"batch_size": 12, "image_size": 32, "workers": 0, "seed": 3, "augment": None}


@pytest.fixture
def bucket(s3_env, image_folder, monkeypatch, tmp_path):
    """(the proxy in front of the S3 server, a fresh bucket holding the image folder under
    ``f/``); caches go to the test's own home."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    name = s3_env.bucket()
    s3_env.upload(image_folder, f"s3://{name}/f")
    with FaultProxy(s3_env.endpoint) as proxy:
        for key, value in proxy.env().items():
            monkeypatch.setenv(key, value)
        yield proxy, name


def _lists(proxy: FaultProxy, bucket: str) -> int:
    return proxy.requests[("GET", f"/{bucket}")]


def _epoch(url: str, **kw: object) -> list[np.ndarray]:
    with stoker.Loader(url, **KW, **kw) as loader:
        return [np.array(x) for x, _ in loader]


@pytest.mark.timeout(180)
def test_a_second_loader_takes_the_cached_listing_and_a_replaced_object_lists_again(
    bucket, s3_env, image_folder, tmp_path
):
    proxy, name = bucket
    url = f"s3://{name}/f/"
    first = _epoch(url)
    listed = _lists(proxy, name)
    assert listed >= 1
    cached = list((tmp_path / "home/.cache/stoker/listing").iterdir())
    assert len(cached) == 1 and stat.S_IMODE(cached[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(cached[0].parent.stat().st_mode) == 0o700
    assert b"testing-secret" not in cached[0].read_bytes()

    again = _epoch(url)
    assert _lists(proxy, name) == listed  # the cached listing: nothing listed again
    assert all(np.array_equal(a, b) for a, b in zip(again, first, strict=True))

    key = "f/class_002/img_00011.jpg"  # replaced after it was listed: refused by name
    other = (image_folder / "class_000/img_00000.jpg").read_bytes()
    s3_env.client().put_object(Bucket=name, Key=key, Body=other)
    with pytest.raises(stoker.ObjectChanged, match=f"s3://{name}/{key}: the object was replaced"):
        _epoch(url, shuffle=False)
    assert not cached[0].exists()  # the refusal dropped the cached listing

    fresh = _epoch(url)  # lists again, and reads the new bytes
    assert _lists(proxy, name) == listed + 1
    assert len(fresh) == len(first)

    s3_env.client().delete_object(Bucket=name, Key=key)  # gone since it was listed
    with pytest.warns(stoker.StokerWarning, match=f"s3://{name}/{key}"):
        _epoch(url, max_errors=1)  # a bad sample named with its URL
    assert not cached[0].exists()  # and the cached listing is dropped


@pytest.mark.timeout(180)
def test_listing_ttl_0_lists_at_every_loader_and_sees_an_added_object(bucket, s3_env, image_folder):
    proxy, name = bucket
    url = f"s3://{name}/f/"
    first = _epoch(url, shuffle=False)
    listed = _lists(proxy, name)
    extra = (image_folder / "class_000/img_00000.jpg").read_bytes()
    s3_env.client().put_object(Bucket=name, Key="f/class_000/zz_added.jpg", Body=extra)
    assert len(_epoch(url, shuffle=False)) == len(first)  # the default: the cached listing
    assert _lists(proxy, name) == listed
    with stoker.Loader(url, **{**KW, "batch_size": 1}, shuffle=False, listing_ttl=0) as loader:
        assert len(loader) == 37  # listed now: the added object is in
    assert _lists(proxy, name) == listed + 1
    with pytest.raises(stoker.ConfigError, match=r"listing_ttl=-1: .* a number >= 0"):
        stoker.Loader(url, listing_ttl=-1)


@pytest.mark.timeout(120)
def test_a_cached_listing_another_user_could_have_written_is_not_used(bucket, tmp_path):
    proxy, name = bucket
    url = f"s3://{name}/f"
    _epoch(url)
    cached = next((tmp_path / "home/.cache/stoker/listing").iterdir())
    os.chmod(cached, 0o666)  # as if planted: writable by anyone
    listed = _lists(proxy, name)
    with pytest.warns(stoker.StokerWarning, match="writable by group or others"):
        _epoch(url)
    assert _lists(proxy, name) == listed + 1  # listed again, not read from that file


@pytest.mark.timeout(120)
def test_a_table_naming_an_object_its_cached_listing_lacks_lists_that_prefix_again(bucket, s3_env):
    proxy, name = bucket
    store = open_store(f"s3://{name}/f")
    urls = [f"s3://{name}/f/class_000/img_00000.jpg", f"s3://{name}/f/class_000/new.jpg"]
    assert [e.size for e in lookup(store, urls)][1] == -1  # not there (yet)
    s3_env.client().put_object(Bucket=name, Key="f/class_000/new.jpg", Body=b"\xff\xd8")
    before = _lists(proxy, name)
    found = lookup(store, urls[:1])
    assert _lists(proxy, name) == before and found[0].size > 0  # the cache holds it
    found = lookup(store, urls)
    assert _lists(proxy, name) == before + 1 and found[1].size == 2  # listed again for it


@pytest.mark.timeout(120)
def test_a_bucket_source_travels_with_its_listing(bucket):
    """What a worker or a cluster node receives lists nothing (the Recipe carries the source)."""
    proxy, name = bucket
    with stoker.Loader(f"s3://{name}/f", **KW) as loader:
        listed = _lists(proxy, name)
        copy = pickle.loads(pickle.dumps(loader.recipe.source))
        assert copy.fingerprint() == loader.recipe.source.fingerprint()
        assert copy.read(0) == loader.recipe.source.read(0)
        assert _lists(proxy, name) == listed


def test_a_listing_is_trusted_for_its_ttl_and_keyed_without_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    url = "s3://b/p"
    entries = [Entry("s3://b/p/a.jpg", 10, '"e1"'), Entry("s3://b/p/q/b.jpg", 3, '"e2"')]
    path = tmp_path / "l.npz"
    assert listing.save(path, url, entries, now=1000.0)
    assert listing.load(path, url, now=1000.0 + listing.TTL - 1) == entries
    assert listing.load(path, url, now=1000.0 + listing.TTL) is None  # expired
    assert listing.load(path, url, now=999.0) is None  # listed "in the future": a clock moved
    assert listing.load(path, "s3://b/other", now=1000.0) is None

    def key(**options: object) -> str:
        return listing.listing_key(open_store(url, options), url, True)

    plain = key(endpoint_url="http://127.0.0.1:9")
    assert plain == key(endpoint_url="http://127.0.0.1:9", key="AK", secret="s3cr3t", token="T")
    assert plain != key(endpoint_url="http://127.0.0.1:8")  # another store
    assert plain != key(endpoint_url="http://127.0.0.1:9", requester_pays=True)
    assert "s3cr3t" not in repr(open_store(url, {"secret": "s3cr3t"}).scope())
    shown = open_store(url, {"endpoint_url": "http://u:pw@h:9"}).scope()
    assert "pw" not in repr(shown)


RANKS = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, {src!r})
    import boto3
    import torch.distributed as dist
    import stoker

    url, work, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["HOME"] = os.path.join(work, f"home{{rank}}")  # no cache in common
    bucket, flag = url.split("/")[2], os.path.join(work, "uploaded")
    # made before the group (as Lightning does): each rank lists g/ on its own, and an object
    # is added between rank 0's listing and rank 1's (a handshake through a file)
    if rank == 1:
        for _ in range(2400):
            if os.path.exists(flag):
                break
            time.sleep(0.05)
    early = stoker.Loader(f"s3://{{bucket}}/g/", batch_size=6, image_size=16, workers=0)
    if rank == 0:
        boto3.client("s3").put_object(Bucket=bucket, Key="g/class_000/new.jpg", Body=b"x")
        open(flag, "w").close()
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            init_method="tcp://127.0.0.1:" + sys.argv[4])
    out = {{"rank": rank}}
    try:
        out["early"] = len(early)
    except stoker.SourceError as exc:
        out["early"] = str(exc)
    with stoker.Loader(url, batch_size=6, image_size=16, workers=0) as loader:
        out["fingerprint"] = loader.recipe.source.fingerprint()
        out["samples"] = len(loader.recipe.source)
    try:
        stoker.Loader("s3://no-such-bkt-zz/none/", batch_size=6)
    except stoker.SourceError as exc:
        out["error"] = str(exc)
    print("RESULT " + json.dumps(out))
    early.close()
    dist.destroy_process_group()
    """
)


@pytest.mark.timeout(240)
def test_every_rank_takes_rank_0s_listing_and_ranks_that_listed_apart_are_compared(
    bucket, s3_env, image_folder, tmp_path
):
    proxy, name = bucket
    pytest.importorskip("torch.distributed")
    s3_env.upload(image_folder / "class_000", f"s3://{name}/g/class_000")
    outs = run_ranks(tmp_path, RANKS, f"s3://{name}/f/", str(tmp_path))
    assert outs[0]["fingerprint"] == outs[1]["fingerprint"] and outs[0]["samples"] == 36
    assert _lists(proxy, name) == 3  # g/ by each rank before the group; f/ by rank 0 alone
    assert proxy.requests[("GET", "/no-such-bkt-zz")] == 1  # rank 1 got rank 0's error
    assert "no-such-bkt-zz" in outs[1]["error"] and "does not exist" in outs[1]["error"]
    assert "rank 0's listing" in outs[1]["error"]
    assert isinstance(outs[0]["early"], int)  # rank 0 never waits, never compares
    error = outs[1]["early"]
    assert f"s3://{name}/g: rank 1 listed 13 objects here and rank 0 listed 12" in error
    assert "before init_process_group" in error and "Make the Loader after" in error
    assert len(list((tmp_path / "home1/.cache/stoker/listing").iterdir())) == 1  # g/ only


@pytest.mark.timeout(180)
def test_shards_converted_again_over_a_cached_listing_are_listed_again(
    bucket, s3_env, image_folder, tmp_path
):
    from stoker.cli.convert import convert

    proxy, name = bucket
    url = f"s3://{name}/s/"
    for n, classes in enumerate((["class_000"], ["class_000", "class_001"])):
        part = tmp_path / f"part{n}"
        for cls in classes:
            (part / cls).mkdir(parents=True)
            for f in (image_folder / cls).glob("*.jpg"):
                (part / cls / f.name).write_bytes(f.read_bytes())
        convert(part, tmp_path / f"shards{n}", progress=False)
    s3_env.upload(tmp_path / "shards0", f"s3://{name}/s")
    with stoker.Loader(url, **KW) as loader:
        assert len(loader.recipe.source) == 12
    listed = _lists(proxy, name)
    s3_env.upload(tmp_path / "shards1", f"s3://{name}/s")  # the same names, other bytes
    with stoker.Loader(url, **KW) as loader:  # the manifest disagrees with the cached listing
        assert len(loader.recipe.source) == 24 and len([x for x, _ in loader]) == 2
    assert _lists(proxy, name) == listed + 1
