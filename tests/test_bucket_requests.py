"""Requests to a real S3 API (moto) through the fault proxy (``tests/faultproxy.py``): merged
ranged reads, retries of throttling, resets and short bodies, the rate ceiling's accounting, a
missing object named as a bad sample, and what ``stats()`` shows of it all.

The shards are 36 small JPEGs in one Parquet file; each test uploads them to a fresh bucket and
points ``AWS_ENDPOINT_URL`` at a proxy in front of the session's server.
"""

from __future__ import annotations

import io
import pathlib
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs")

import stoker  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from stoker.cli.convert import convert  # noqa: E402
from stoker.errors import TooManyErrors  # noqa: E402
from stoker.sources import fetch  # noqa: E402


@pytest.fixture(scope="module")
def shards(image_folder: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The image folder as Parquet shards (one file, small row groups)."""
    dst = tmp_path_factory.mktemp("bucket_shards")
    convert(image_folder, dst, row_group_bytes=40_000, progress=False)
    return dst


KW = {"batch_size": 12, "image_size": 32, "workers": 0, "seed": 3}


def _epoch(loader: stoker.Loader) -> list[np.ndarray]:
    return [np.array(x) for x, _ in loader]


@pytest.mark.timeout(180)
def test_shards_in_a_bucket_are_read_in_merged_ranges(
    proxied: tuple[FaultProxy, str], shards: pathlib.Path
) -> None:
    proxy, url = proxied
    with stoker.Loader(str(shards), **KW) as local:
        expected = _epoch(local)
    with stoker.Loader(url, **KW) as loader:
        before = proxy.gets(".parquet")
        got = _epoch(loader)
        gets = proxy.gets(".parquet") - before
        requests = loader.stats().requests
    groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in shards.glob("*.parquet"))
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert gets == groups  # a row group's images are one span, fetched once in the epoch
    assert requests["gets"] == gets and requests["gets_per_image"] == pytest.approx(groups / 36)
    assert requests["fetched_per_decoded"] <= 1.05
    assert requests["retries"] == requests["throttled"] == 0
    assert requests["latency_p99_ms"] >= requests["latency_median_ms"] > 0
    assert "storage requests:" in str(loader.stats())


#: The storage options that choose each S3 client (an option obstore has no word for: s3fs).
CLIENTS = {"obstore": None, "s3fs": {"config_kwargs": {"max_pool_connections": 8}}}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("kind", ["503", "429", "reset", "truncate"])
def test_throttling_resets_and_short_bodies_are_retried_and_counted(
    proxied: tuple[FaultProxy, str], kind: str, client: str
) -> None:
    if client == "obstore":
        pytest.importorskip("obstore")
    proxy, url = proxied
    options = {"storage_options": CLIENTS[client]}
    with stoker.Loader(url, **KW, **options) as loader:
        assert loader.recipe.source.store.backend == client
        clean = _epoch(loader)
    with stoker.Loader(url, **KW, **options) as loader:
        proxy.fail(kind, count=2, path=".parquet")
        again = _epoch(loader)
        requests = loader.stats().requests
    assert proxy.faults[kind] == 2
    assert all(np.array_equal(a, b) for a, b in zip(again, clean, strict=True))
    assert loader.stats().skipped == 0
    # a reset on a kept-alive connection may be resent by the HTTP client itself, unseen by
    # stoker (s3fs's aiohttp: the spans fetched ahead at once all ride kept-alive connections)
    resent = kind == "reset" and requests["retries"] in ((0, 1) if client == "s3fs" else (1,))
    assert requests["retries"] == 2 or resent
    assert requests["throttled"] == (2 if kind in ("503", "429") else 0)


@pytest.mark.timeout(180)
def test_first_byte_latency_and_a_bandwidth_cap_only_slow_the_reads(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, url = proxied
    with stoker.Loader(url, **KW) as loader:
        clean = _epoch(loader)
    proxy.latency, proxy.bandwidth = 0.05, 2e6  # 50 ms to the first byte, 2 MB/s a connection
    with stoker.Loader(url, **KW) as loader:
        slow = _epoch(loader)
        requests = loader.stats().requests
    assert all(np.array_equal(a, b) for a, b in zip(slow, clean, strict=True))
    assert requests["retries"] == requests["failed"] == 0 and loader.stats().skipped == 0
    assert requests["latency_median_ms"] >= 50  # the proxy's sleep is in every request


@pytest.mark.timeout(180)
def test_the_request_rate_stays_under_the_ceiling(proxied: tuple[FaultProxy, str]) -> None:
    proxy, url = proxied
    with stoker.Loader(url, **{**KW, "batch_size": 2}, request_rate=20, read_ahead=0) as loader:
        before = proxy.gets(".parquet")
        _epoch(loader)
        gets = proxy.gets(".parquet") - before
    ceiling = fetch.fetcher().ceiling
    assert ceiling.rate == 20.0
    prefix = url.removeprefix("s3://")
    assert sum(ceiling.granted.values()) == gets == ceiling.granted[prefix] >= 5
    assert ceiling.scheduled_rate(url) <= 20.0 * 1.001


@pytest.mark.timeout(180)
def test_a_missing_object_is_a_bad_sample_naming_its_url(
    proxied: tuple[FaultProxy, str], s3_env: object
) -> None:
    proxy, url = proxied
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = s3_env.client()  # type: ignore[attr-defined]
    with stoker.Loader(url, **KW) as loader:
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
        shard = next(k for k in keys if k.endswith(".parquet"))
        client.delete_object(Bucket=bucket, Key=shard)
        with pytest.raises(TooManyErrors) as err:
            _epoch(loader)
    message = str(err.value)
    assert f"s3://{bucket}/{shard}" in message and "not found" in message
    assert "Traceback" not in message and "botocore" not in message


@pytest.mark.timeout(180)
def test_throttling_past_the_deadline_is_a_bad_sample_not_a_hang(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, url = proxied
    with stoker.Loader(url, **KW, timeout=1) as loader:  # one read may take 0.25 s
        proxy.fail("503", count=10_000, path=".parquet")
        with pytest.raises(TooManyErrors) as err:
            _epoch(loader)
    counts = fetch.fetcher().counts  # the failed batch never reported: the process's own count
    assert "SlowDown" in str(err.value) or "reduce your request rate" in str(err.value)
    assert url.split("/")[2] in str(err.value) and "attempts" in str(err.value)
    assert counts.throttled >= 2 and counts.failed >= 2 and counts.retries >= 2


@pytest.mark.timeout(240)
def test_stoker_bench_measures_a_bucket_and_what_its_requests_cost(
    proxied: tuple[FaultProxy, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from stoker.cli import main

    proxy, url = proxied
    flags = "--batch-size 6 --image-size 32 --workers 0 --epochs 1".split()
    assert main(["bench", url, *flags]) == 0
    out = capsys.readouterr().out
    assert "throughput:" in out and "busy cores decode" in out, out
    line = next(ln for ln in out.splitlines() if "storage requests:" in ln)
    assert "GETs" in line and "per image" in line and "latency median" in line, line
    assert proxy.gets(".parquet") > 0


def _tars(image_folder: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """Two WebDataset shards of the image folder (a .jpg and a .cls member per sample)."""
    files = sorted(image_folder.glob("*/*.jpg"))
    folder.mkdir()
    for part, rows in enumerate((range(0, 20), range(20, 36))):
        with tarfile.open(folder / f"shard-{part:04d}.tar", "w") as tar:
            for i in rows:
                for name, data in (
                    (f"s/{i:05d}.jpg", files[i].read_bytes()),
                    (f"s/{i:05d}.cls", files[i].parent.name[-1].encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder


@pytest.mark.timeout(180)
def test_a_run_of_tar_members_is_one_get_and_a_folder_takes_one_get_per_image(
    proxied: tuple[FaultProxy, str],
    s3_env: object,
    image_folder: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    proxy, url = proxied
    bucket = url.removeprefix("s3://").split("/")[0]
    tars = _tars(image_folder, tmp_path / "wds")
    s3_env.upload(tars, f"s3://{bucket}/wds")  # type: ignore[attr-defined]
    s3_env.upload(image_folder, f"s3://{bucket}/folder")  # type: ignore[attr-defined]
    for layout, local, most in (("wds", tars, 2 * 3), ("folder", image_folder, 36)):
        with stoker.Loader(str(local), **KW) as loader:
            expected = _epoch(loader)
        with stoker.Loader(f"s3://{bucket}/{layout}/", **KW) as loader:
            before = proxy.gets(f"/{layout}/")
            got = _epoch(loader)
            gets = proxy.gets(f"/{layout}/") - before
            requests = loader.stats().requests
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)), layout
        # tars: each batch's members of a tar lie within the gap of each other: one GET per
        # tar and batch at most; a folder: one GET per image, never more
        assert 0 < gets <= most and requests["gets"] == gets, (layout, gets)
        assert requests["gets_per_image"] <= (most / 36), layout


FOOTER_READ = 64 << 10  # what a Parquet footer read fetches from the end of a file


def _column_bytes(folder: pathlib.Path, leaf: str) -> int:
    total = 0
    for path in folder.glob("*.parquet"):
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            for c in range(group.num_columns):
                if group.column(c).path_in_schema == leaf:
                    total += group.column(c).total_compressed_size
    return total


@pytest.mark.timeout(180)
def test_opening_indexed_shards_again_reads_no_image_bytes(
    proxied: tuple[FaultProxy, str], shards: pathlib.Path
) -> None:
    """Building a shard's offset index reads each image once; a Loader over shards whose
    offset index is cached reads their footers and labels only:
    the rows without image bytes come from the index, and the label chunks of every row group
    arrive in one round of concurrent GETs (each row group one after the other was seconds
    behind a real latency, and the path check read every image)."""
    proxy, url = proxied
    proxy.reset_counts()
    stoker.Loader(url, **KW).close()  # builds and caches each shard's offset index
    built = proxy.stats()["bytes_sent"]
    proxy.reset_counts()
    with stoker.Loader(url, **KW) as loader:
        sent = proxy.stats()["bytes_sent"]
        assert len(loader) == 3
    images = _column_bytes(shards, "image.bytes")
    labels = _column_bytes(shards, "label")
    groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in shards.glob("*.parquet"))
    assert groups > 4 and images > 2 * FOOTER_READ
    # the footer is one read of the file's last FOOTER_READ bytes (images among them), then
    # the label chunks: no other image bytes
    assert sent <= FOOTER_READ + labels + 8192 * groups, (sent, images, labels)
    # building the index read each image once (Parquet's read of a chunk came from memory),
    # beside what the cached open reads and the one LIST answer (under 4 KiB here) it skips
    paths = _column_bytes(shards, "image.path")
    assert images <= built <= images + paths + sent + 4096, (built, images, paths, sent)


@pytest.mark.timeout(180)
def test_indexed_shard_rows_holding_only_a_path_are_refused_at_construction(
    s3_bucket: str, s3_env: object, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the image bytes stored verbatim (so an offset index is built), the rows the index
    finds empty have their path read and are refused by name, as without an index."""
    import pyarrow as pa

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    from PIL import Image

    folder = tmp_path / "hf"
    folder.mkdir()
    cells = []
    for i in range(6):
        buf = io.BytesIO()
        Image.fromarray(np.full((6, 6, 3), 20 * i, np.uint8)).save(buf, format="PNG")
        cells.append({"bytes": None if i == 4 else buf.getvalue(), "path": f"imgs/{i}.png"})
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array(cells, type=kind), "label": pa.array(range(6))})
    pq.write_table(
        table, folder / "train.parquet", row_group_size=2, compression="none", use_dictionary=False
    )
    s3_env.upload(folder, f"s3://{s3_bucket}/hf")  # type: ignore[attr-defined]
    for _ in range(2):  # the index is built, then taken from the cache
        with pytest.raises(stoker.SourceError, match=r"(?s)train\.parquet.*1 rows.*row 4: imgs/4"):
            stoker.Loader(f"s3://{s3_bucket}/hf/train.parquet", batch_size=2, image_size=6)
