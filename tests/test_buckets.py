"""Every source layout in a bucket gives the batches of the same data on a local disk, on a real
S3 API (moto's server, tests/buckets.py); an object replaced, missing, refused or a bucket that
does not exist is one clear error naming the URL. The data is the 36-JPEG image_folder, uploaded
once for the module (moto is slow per request)."""

from __future__ import annotations

import io
import tarfile
import warnings

import numpy as np
import pytest

import stoker
from stoker.cli.convert import convert

COMMON = {"batch_size": 8, "image_size": 32, "augment": "train", "seed": 1}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Caches go to the test's own home, never ~/.cache."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _tars(image_folder, folder):
    """Two WebDataset shards of the image folder (a .jpg and a .cls member per sample)."""
    files = sorted(image_folder.glob("*/*.jpg"))
    folder.mkdir()
    for part, rows in enumerate((range(0, 20), range(20, 36))):
        with tarfile.open(folder / f"shard-{part:04d}.tar", "w") as tar:
            for i in rows:
                label = files[i].parent.name[-1].encode()
                for name, data in (
                    (f"s/{i:05d}.jpg", files[i].read_bytes()),
                    (f"s/{i:05d}.cls", label),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder


@pytest.fixture(scope="module")
def data(s3_server, image_folder, tmp_path_factory):
    """The image folder on disk and in a bucket, as an ImageFolder (with labels.csv), as tar
    shards and as Parquet shards: ``{layout: (local source, bucket source)}``."""
    work = tmp_path_factory.mktemp("bucket_data")
    bucket = s3_server.bucket()
    tars = _tars(image_folder, work / "wds")
    shards = work / "shards"
    convert(image_folder, shards, shard_bytes=60_000, row_group_bytes=12_000, progress=False)
    for p in shards.glob("*.idx.npy"):
        p.unlink()
    s3_server.upload(image_folder, f"s3://{bucket}/folder")
    s3_server.upload(tars, f"s3://{bucket}/wds")
    s3_server.upload(shards, f"s3://{bucket}/shards")
    files = sorted(image_folder.glob("*/*.jpg"))
    labels = [int(f.parent.name[-1]) for f in files]
    urls = [f"s3://{bucket}/folder/{f.relative_to(image_folder).as_posix()}" for f in files]
    return bucket, {
        "folder": ({"source": str(image_folder)}, {"source": f"s3://{bucket}/folder/"}),
        "csv": (
            {"source": str(image_folder / "labels.csv")},
            {"source": f"s3://{bucket}/folder/labels.csv"},
        ),
        "tar": ({"source": str(tars)}, {"source": f"s3://{bucket}/wds"}),
        "parquet": ({"source": str(shards)}, {"source": f"s3://{bucket}/shards"}),
        "paths": (
            {"paths": [str(f) for f in files], "labels": labels},
            {"paths": urls, "labels": labels},
        ),
    }


def _batches(given, **kw):
    with stoker.Loader(**given, **COMMON, **kw) as loader:
        return [(x.copy(), y.copy()) for x, y in loader]


def _same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["folder", "csv", "tar", "parquet", "paths"])
def test_every_layout_in_a_bucket_gives_the_local_batches(s3_env, data, layout):
    local, remote = data[1][layout]
    want = _batches(local, workers=0)
    _same(_batches(remote, workers=0), want)
    _same(_batches(remote, workers=2), want)


@pytest.mark.timeout(120)
def test_an_object_replaced_mid_epoch_is_an_error_naming_it(s3_env, data, image_folder):
    bucket = s3_env.bucket()
    s3_env.upload(image_folder / "class_002", f"s3://{bucket}/f/class_002")
    s3_env.upload(image_folder / "class_001", f"s3://{bucket}/f/class_001")
    url = f"s3://{bucket}/f/class_002/img_00011.jpg"  # the last sample: in the last batch
    args = {**COMMON, "augment": None, "shuffle": False, "workers": 0}  # made on demand
    with stoker.Loader(f"s3://{bucket}/f", **args) as loader:
        batches = iter(loader)
        next(batches)
        other = (image_folder / "class_000" / "img_00000.jpg").read_bytes()
        s3_env.client().put_object(Bucket=bucket, Key="f/class_002/img_00011.jpg", Body=other)
        with pytest.raises(stoker.ObjectChanged, match=f"{url}: the object was replaced"):
            list(batches)


@pytest.mark.timeout(120)
def test_a_missing_object_is_a_bad_sample_named_with_its_url(s3_env, data, image_folder):
    bucket, layouts = data
    given = dict(layouts["csv"][1])
    gone = f"s3://{bucket}/folder/class_001/img_00003.jpg"
    s3_env.client().delete_object(Bucket=bucket, Key="folder/class_001/img_00003.jpg")
    try:
        with pytest.warns(stoker.StokerWarning, match=f"{gone}"):
            with stoker.Loader(**given, **COMMON, workers=0, max_errors=2) as loader:
                assert sum(len(y) for _, y in loader) == len(loader) * 8  # replaced, shape kept
                assert [n for n, _ in loader.stats().bad_files] == [gone]
    finally:
        s3_env.upload(image_folder / "class_001/img_00003.jpg", f"s3://{bucket}/folder/class_001")


def _auth(count):
    """Turn the in-process moto server's credential checks on (0: every request is checked
    against its IAM, which knows no key) or off (``inf``)."""
    from moto import settings
    from moto.core.responses import ActionAuthenticatorMixin

    settings.INITIAL_NO_AUTH_ACTION_COUNT = count
    ActionAuthenticatorMixin.request_count = 0


@pytest.mark.timeout(60)
def test_wrong_credentials_and_a_missing_bucket_are_clear_errors(s3_env, data, monkeypatch):
    bucket = data[0]
    with pytest.raises(stoker.SourceError, match="no-such-bkt.*does not exist.*endpoint"):
        stoker.Loader("s3://no-such-bkt/folder/", **COMMON)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    _auth(0)
    try:
        with pytest.raises(stoker.SourceError) as caught:
            stoker.Loader(f"s3://{bucket}/folder/", **COMMON)
    finally:
        _auth(float("inf"))
    text = str(caught.value)
    assert f"s3://{bucket}/folder: cannot list: access denied" in text and "credentials" in text
    assert "Traceback" not in text and "botocore" not in text


@pytest.mark.timeout(60)
def test_storage_options_reach_the_store_and_no_secret_is_shown(s3_server, data, monkeypatch):
    bucket = data[0]
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    options = {
        "endpoint_url": s3_server.endpoint,
        "key": "testing",
        "secret": "testing-secret",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = stoker.Loader(f"s3://{bucket}/folder", **COMMON, storage_options=options)
    with loader:
        next(iter(loader))
        shown = repr(loader.options) + str(loader.stats()) + str(loader.state_dict())
    assert "testing-secret" not in shown


class _Killed(BaseException):
    """Stands for the run being killed (raised out of an upload, caught by no handler)."""


@pytest.mark.timeout(240)
def test_convert_reads_from_and_writes_to_a_bucket_and_resumes_after_a_kill(
    s3_env, data, monkeypatch
):
    from stoker.cli.convert_bucket import staging
    from stoker.sources.store import Store

    bucket = data[0]
    src, dst = f"s3://{bucket}/folder/", f"s3://{bucket}/converted"
    small = {"shard_bytes": 60_000, "row_group_bytes": 12_000, "progress": False}
    real_put, puts = Store.put, []

    def put(self, local, url):
        puts.append(url.rsplit("/", 1)[1])
        if len(puts) == 2 and killing:  # killed after the first shard's upload
            raise _Killed
        real_put(self, local, url)

    monkeypatch.setattr(Store, "put", put)
    killing = True
    with pytest.raises(_Killed):
        convert(src, dst, **small)
    killing, puts[:] = False, []
    staged = staging(dst)[1]  # as if killed while shard 1 was written: it is not finished
    (staged / "shard-00001.parquet").unlink()
    again = convert(src, dst, **small)
    assert again["run"]["shards_built"] == 1 and len(again["shards"]) >= 3
    assert not staged.exists()  # removed once the manifest is in the bucket
    assert "shard-00000.parquet" not in puts  # already in the bucket with its size
    assert puts[-1] == "stoker-manifest.json"  # last: a manifest lists only shards present
    args = {"shuffle": False, "workers": 0}
    _same(_batches({"source": dst}, **args), _batches({"source": src}, **args))


@pytest.fixture(scope="module")
def gcs_endpoint():
    """A GCS API on loopback: the pip gcp-storage-emulator, in memory, bucket ``gbkt``."""
    pytest.importorskip("gcp_storage_emulator.server")
    from gcp_storage_emulator.server import create_server

    from helpers import free_port

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="gbkt")
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.mark.timeout(180)
def test_an_image_folder_on_gcs_gives_the_local_batches(gcs_endpoint, image_folder):
    import gcsfs.core

    options = {"endpoint_url": gcs_endpoint, "token": "anon"}
    fs = gcsfs.core.GCSFileSystem(**options)
    for path in sorted(image_folder.glob("*/*.jpg")):
        fs.pipe(f"gbkt/f/{path.relative_to(image_folder).as_posix()}", path.read_bytes())
    want = _batches({"source": str(image_folder)}, workers=0)
    _same(_batches({"source": "gs://gbkt/f/"}, workers=0, storage_options=options), want)


@pytest.mark.timeout(120)
def test_a_bucket_resumes_exactly_and_splits_across_ranks_as_the_disk_does(s3_env, data):
    local, remote = data[1]["folder"]
    args = {"workers": 0, "rank": 1, "world_size": 2}
    want = _batches(local, **args)
    _same(_batches(remote, **args), want)  # rank 1's share, as from the disk
    with stoker.Loader(**remote, **COMMON, **args) as loader:
        batches = iter(loader)
        next(batches)
        state = loader.state_dict()
    with stoker.Loader(**remote, **COMMON, **args) as again:
        again.load_state_dict(state)
        _same([(x.copy(), y.copy()) for x, y in again], want[1:])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["503", "reset", "truncate"])
def test_gcs_throttling_resets_and_short_bodies_are_retried_and_counted(
    gcs_endpoint, image_folder, kind
):
    """gcsfs's own retries are bypassed, so stoker's count each one (the emulator ignores
    generations: a replaced object on GCS is not tested here, see docs/sources.md)."""
    import gcsfs.core

    from faultproxy import FaultProxy

    fs = gcsfs.core.GCSFileSystem(endpoint_url=gcs_endpoint, token="anon")
    for path in sorted(image_folder.glob("*/*.jpg")):
        fs.pipe(f"gbkt/r/{path.relative_to(image_folder).as_posix()}", path.read_bytes())
    want = _batches({"source": str(image_folder)}, workers=0)
    with FaultProxy(gcs_endpoint) as proxy:
        options = {"endpoint_url": proxy.endpoint, "token": "anon"}
        with stoker.Loader("gs://gbkt/r/", **COMMON, workers=0, storage_options=options) as loader:
            proxy.fail(kind, count=2, path="/download/")
            got = [(x.copy(), y.copy()) for x, y in loader]
            requests = loader.stats().requests
    _same(got, want)
    assert proxy.faults[kind] == 2 and loader.stats().skipped == 0
    assert requests["retries"] == 2 or kind == "reset" and requests["retries"] == 1
    assert requests["throttled"] == (2 if kind == "503" else 0)
