"""stoker convert: Parquet layout, verbatim bytes, manifest, resume, bad inputs, re-encoding."""

import csv
import hashlib
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

import stoker
from stoker.cli import main
from stoker.cli.convert import MANIFEST, convert
from stoker.sources import FolderSource, open_source

SMALL = {"shard_bytes": 60_000, "row_group_bytes": 12_000, "progress": False}


@pytest.fixture(scope="module")
def converted(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("converted") / "shards"
    return dst, convert(image_folder, dst, **SMALL)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(60)
def test_layout_and_schema(converted):
    dst, manifest = converted
    files = sorted(p.name for p in dst.glob("*.parquet"))
    assert len(files) >= 2
    assert files == [f"shard-{k:05d}.parquet" for k in range(len(files))]
    for path in dst.glob("shard-*.parquet"):
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        assert schema.names == ["image", "label"]
        assert [f.name for f in schema.field("image").type] == ["bytes", "path"]
        assert str(schema.field("label").type) == "int64"
        assert b"huggingface" in schema.metadata
        md = pf.metadata
        for g in range(md.num_row_groups):
            chunk = md.row_group(g).column(0)
            assert chunk.path_in_schema == "image.bytes"
            assert chunk.compression == "UNCOMPRESSED"
            assert not chunk.has_dictionary_page and "PLAIN" in chunk.encodings
    assert sum(pq.ParquetFile(p).metadata.num_row_groups for p in dst.glob("*.parquet")) > len(
        files
    )


@pytest.mark.timeout(60)
def test_image_bytes_are_verbatim(converted, image_folder):
    dst, _ = converted
    labels = FolderSource(image_folder).classes
    seen = 0
    for path in sorted(dst.glob("shard-*.parquet")):
        raw = path.read_bytes()
        for row in pq.read_table(path).to_pylist():
            original = (image_folder / row["image"]["path"]).read_bytes()
            assert row["image"]["bytes"] == original
            assert raw.count(original) == 1  # stored as is, in one piece
            assert labels[row["label"]] == row["image"]["path"].split("/")[0]
            seen += 1
    assert seen == 36


@pytest.mark.timeout(60)
def test_manifest_counts_and_checksums(converted, image_folder):
    dst, manifest = converted
    on_disk = json.loads((dst / MANIFEST).read_text())
    assert on_disk == manifest
    assert manifest["stoker_version"] == stoker.__version__
    assert manifest["source"]["fingerprint"] == FolderSource(image_folder).fingerprint()
    assert manifest["classes"] == ["class_000", "class_001", "class_002"]
    assert manifest["rows"] == 36 and manifest["errors"] == 0
    assert manifest["label_counts"] == {"0": 12, "1": 12, "2": 12}
    for shard in manifest["shards"]:
        path = dst / shard["file"]
        assert shard["bytes"] == path.stat().st_size
        assert shard["sha256"] == _sha(path)
        assert shard["rows"] == pq.ParquetFile(path).metadata.num_rows == sum(shard["row_groups"])
    assert (dst / "errors.csv").read_text().splitlines() == ["shard,index,name,reason"]


@pytest.mark.timeout(90)
def test_interrupted_run_resumes_rebuilding_only_missing_shards(image_folder, tmp_path):
    dst = tmp_path / "shards"
    first = convert(image_folder, dst, **SMALL)
    assert len(first["shards"]) >= 3
    kept, lost = dst / "shard-00000.parquet", dst / "shard-00001.parquet"
    kept_mtime, lost_sha = kept.stat().st_mtime_ns, _sha(lost)
    # simulate a run killed while writing shard 1: its .tmp half-written, no final file
    half = lost.read_bytes()[: lost.stat().st_size // 2]
    lost.unlink()
    (dst / ".shard-00001.parquet.tmp").write_bytes(half)
    (dst / MANIFEST).unlink()
    again = convert(image_folder, dst, **SMALL)
    assert again["run"]["shards_built"] == 1
    assert again["run"]["shards_kept"] == len(first["shards"]) - 1
    assert kept.stat().st_mtime_ns == kept_mtime
    assert _sha(lost) == lost_sha  # the assignment and the bytes are deterministic
    assert not list(dst.glob(".*.tmp"))
    assert again["shards"] == first["shards"]


@pytest.mark.timeout(60)
def test_corrupt_inputs_are_listed_and_skipped(image_folder, corrupt_files, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    for key in ("bad_text", "bad_zero_bytes"):
        shutil.copy(corrupt_files[key], src / "class_001")
    manifest = convert(src, tmp_path / "out", **SMALL)
    assert manifest["rows"] == 36 and manifest["errors"] == 2
    with open(tmp_path / "out" / "errors.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["name"].rsplit("/", 1)[1] for r in rows) == [
        "bad_text.jpg",
        "bad_zero_bytes.jpg",
    ]
    assert all(r["reason"].startswith("DecodeError") and r["shard"] for r in rows)
    assert len(open_source(tmp_path / "out")) == 36


@pytest.mark.timeout(60)
def test_max_side_reencodes_smaller_jpegs(image_folder, tmp_path):
    manifest = convert(image_folder, tmp_path / "small", max_side=40, quality=80, **SMALL)
    src = open_source(tmp_path / "small")
    assert len(src) == manifest["rows"] == 36
    for i in range(len(src)):
        data = src.read(i)
        assert data[:2] == b"\xff\xd8"
        with Image.open(__import__("io").BytesIO(data)) as im:
            assert max(im.size) == 40
    size = sum(s["bytes"] for s in manifest["shards"])
    original = sum(p.stat().st_size for p in image_folder.glob("*/*.jpg"))
    assert size < original


@pytest.mark.timeout(120)
def test_loader_over_shards_gives_the_same_batches_as_the_folder(converted, image_folder):
    dst, _ = converted
    kw = {"batch_size": 8, "image_size": 32, "augment": "eval", "shuffle": False, "seed": 3}
    with (
        stoker.Loader(image_folder, workers=0, **kw) as a,
        stoker.Loader(dst, workers=2, **kw) as b,
    ):
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
        assert b.class_names == a.class_names


@pytest.mark.timeout(120)
def test_two_workers_write_the_same_shards_and_the_cli_works(image_folder, converted, tmp_path):
    dst, manifest = converted
    assert (
        main(
            [
                "convert",
                str(image_folder),
                str(tmp_path / "cli"),
                "--workers",
                "2",
                "--shard-mb",
                str(SMALL["shard_bytes"] / 2**20),
                "--row-group-mb",
                str(SMALL["row_group_bytes"] / 2**20),
                "--quiet",
            ]
        )
        == 0
    )
    other = json.loads((tmp_path / "cli" / MANIFEST).read_text())
    assert [s["sha256"] for s in other["shards"]] == [s["sha256"] for s in manifest["shards"]]


def test_bad_arguments_and_foreign_destination(image_folder, tmp_path):
    with pytest.raises(stoker.ConfigError, match="quality"):
        convert(image_folder, tmp_path / "x", quality=0)
    convert(image_folder, tmp_path / "y", **SMALL)
    with pytest.raises(stoker.ConfigError, match="different conversion"):
        convert(image_folder, tmp_path / "y", max_side=10, **SMALL)


@pytest.mark.timeout(120)
def test_a_file_name_that_is_not_utf8_is_stored_escaped_and_the_shards_load(image_folder, tmp_path):
    """A Latin-1 file name (and a corrupt file under one) no longer fails the whole convert
    with UnicodeEncodeError: the path column holds its bytes with \\xNN escapes."""
    import os

    src = tmp_path / "src"
    shutil.copytree(image_folder, src, ignore=shutil.ignore_patterns("*.csv"))
    first = sorted((src / "class_000").glob("*.jpg"))[0]
    os.rename(first, os.fsdecode(bytes(src / "class_000") + b"/caf\xe9.jpg"))
    (src / "class_001").joinpath(os.fsdecode(b"bad\xff.jpg")).write_bytes(b"not a jpeg")
    dst = tmp_path / "shards"
    convert(src, dst, **SMALL)
    paths = [
        p
        for f in sorted(dst.glob("*.parquet"))
        for p in pq.read_table(f, columns=["image"])
        .column("image")
        .combine_chunks()
        .field("path")
        .to_pylist()
    ]
    assert "class_000/caf\\xe9.jpg" in paths and len(paths) == 36
    errors = (dst / "errors.csv").read_text(encoding="utf-8")
    assert "class_001/bad\\xff.jpg" in errors
    with stoker.Loader(dst, batch_size=6, image_size=16, workers=0, shuffle=False) as loader:
        assert sum(len(y) for _, y in loader) == 36


# names that are not plain text: not UTF-8, a newline, a tab, a backslash, and a UTF-8 name
# that spells the escape of another ("x\xe9" with a real backslash beside "x" + byte 0xE9)
ODD_CLASSES = [b"caf\xe9", b"new\nline", b"t\tab", b"back\\slash"]
ODD_FILES = [b"im\xff.jpg", b"x\xe9.jpg", b"x\\xe9.jpg", b"nl\nfile.jpg", b"tab\tfile.jpg"]


@pytest.mark.timeout(180)
def test_any_name_goes_through_the_convert_command_and_back_through_a_loader(
    image_folder, tmp_path
):
    """Class folders and files whose names are not UTF-8, or hold a newline, a tab or a
    backslash, are stored losslessly (`stoker convert` used to fail: UnicodeEncodeError):
    the shards are valid UTF-8 Parquet, and a Loader reads back the same classes, paths,
    labels and bytes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    jpegs = sorted(image_folder.glob("*/*.jpg"))
    src = tmp_path / "src"
    for c, cls in enumerate(ODD_CLASSES):
        folder = os.path.join(bytes(src), cls)
        os.makedirs(folder)
        for f, name in enumerate(ODD_FILES):
            shutil.copyfile(jpegs[c * len(ODD_FILES) + f], os.path.join(folder, name))
    dst = tmp_path / "shards"
    proc = subprocess.run(
        [sys.executable, "-m", "stoker", "convert", str(src), str(dst), "--quiet"],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONPATH": str(Path(stoker.__file__).parents[1])},
    )
    assert proc.returncode == 0, proc.stderr
    for shard in dst.glob("*.parquet"):
        pq.read_table(shard).validate(full=True)  # every string is valid UTF-8
    options = {"batch_size": 5, "image_size": 16, "workers": 0, "shuffle": False}
    with (
        stoker.Loader(src, augment=None, batch="dict", **options) as before,
        stoker.Loader(dst, augment=None, batch="dict", **options) as after,
    ):
        assert after.class_names == before.class_names
        assert sorted(before.class_names) == sorted(os.fsdecode(c) for c in ODD_CLASSES)
        n = len(before.recipe.source)
        assert len(after.recipe.source) == n == len(ODD_CLASSES) * len(ODD_FILES)
        paths = [before.recipe.source.index.relative(i) for i in range(n)]
        assert [after.recipe.source.stored_path(i) for i in range(n)] == paths
        for i in range(n):
            with open(before.recipe.source.index.path(i), "rb") as f:
                assert after.recipe.source.read(i) == f.read()
        for x, y in zip(before, after, strict=True):
            assert (x["label"] == y["label"]).all() and (x["image"] == y["image"]).all()
            classes = [after.class_names[k] for k in y["label"]]
            assert classes == [paths[i].split("/")[0] for i in y["index"]]
