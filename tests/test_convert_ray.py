"""stoker convert --engine ray: same shards and manifest as the local engine, resume, failures.

The tests marked ``ray`` start a local Ray cluster (``num_cpus=2``, no dashboard) and shut it down
before they end, so the suite's leak check (no child process left) holds; they are skipped when
Ray is not installed. Run them alone with ``python -m pytest -m ray tests/test_convert_ray.py``.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stoker.cli import main
from stoker.cli.convert import ERRORS, MANIFEST, STATE, convert, shard_name
from stoker.errors import ConfigError, StokerError

SMALL = {"shard_bytes": 60_000, "row_group_bytes": 12_000, "progress": False}
HAVE_RAY = importlib.util.find_spec("ray") is not None
skip_no_ray = pytest.mark.skipif(
    not HAVE_RAY, reason="ray is not installed (pip install 'stoker[ray]')"
)


def _shards(dst):
    return {p.name: p.read_bytes() for p in sorted(dst.glob("shard-*.parquet"))}


def _without_run(manifest):
    return {k: v for k, v in manifest.items() if k != "run"}


def _assert_same_output(a, b):
    """Byte-identical shards, errors.csv and plan; manifests equal except the run's timings."""
    assert _shards(a) and _shards(a) == _shards(b)
    assert (a / ERRORS).read_bytes() == (b / ERRORS).read_bytes()
    assert (a / STATE / "plan.json").read_bytes() == (b / STATE / "plan.json").read_bytes()
    ma, mb = (json.loads((d / MANIFEST).read_text()) for d in (a, b))
    assert _without_run(ma) == _without_run(mb)
    assert [s["sha256"] for s in ma["shards"]] == [s["sha256"] for s in mb["shards"]]


@pytest.mark.timeout(30)
def test_import_stoker_does_not_import_ray():
    code = (
        "import sys, stoker, stoker.cli.convert, stoker.cli, stoker.sources; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.timeout(30)
def test_bad_engine_arguments(image_folder, tmp_path):
    with pytest.raises(ConfigError, match="engine"):
        convert(image_folder, tmp_path / "a", engine="spark", **SMALL)
    with pytest.raises(ConfigError, match="ray_address"):
        convert(image_folder, tmp_path / "b", ray_address="auto", **SMALL)


@pytest.mark.ray
@skip_no_ray
@pytest.mark.timeout(180)
def test_ray_engine_matches_local_and_resumes(image_folder, tmp_path):
    import ray

    local, remote = tmp_path / "local", tmp_path / "ray"
    convert(image_folder, local, **SMALL)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        manifest = convert(image_folder, remote, engine="ray", workers=2, **SMALL)
        assert manifest["run"]["shards_built"] == len(manifest["shards"]) >= 3
        _assert_same_output(local, remote)

        victim = remote / shard_name(1)
        others = {
            p.name: p.stat().st_mtime_ns for p in remote.glob("shard-*.parquet") if p != victim
        }
        victim.unlink()
        again = convert(image_folder, remote, engine="ray", workers=2, **SMALL)
        assert again["run"]["shards_built"] == 1
        assert again["run"]["shards_kept"] == len(others)
        assert again["run"]["samples_converted"] == again["shards"][1]["rows"]
        assert {n: (remote / n).stat().st_mtime_ns for n in others} == others  # untouched
        _assert_same_output(local, remote)
        assert ray.is_initialized()  # a session the caller started is left running
        _check_sources_travel_by_value(ray, image_folder)
    finally:
        ray.shutdown()


def _check_sources_travel_by_value(ray, image_folder):
    """A task on another node cannot open this machine's shared memory: for Ray, path indexes
    and array sources are serialised by value, and no /dev/shm segment is made."""
    from stoker.cli.convert_ray import by_value
    from stoker.sources import ArraySource, FolderSource

    shm = set(Path("/dev/shm").glob("stoker_*"))
    folder = FolderSource(image_folder)
    images = np.arange(4 * 8 * 8 * 3, dtype=np.uint8).reshape(4, 8, 8, 3)
    arrays = ArraySource(images, [0, 1, 0, 1])
    with by_value(ray):
        folder2, arrays2 = ray.get(ray.put((folder, arrays)))
    assert folder2.index._shared is None and arrays2._shared is None
    assert [folder2.name(i) for i in range(36)] == [folder.name(i) for i in range(36)]
    assert list(folder2.labels) == list(folder.labels)
    assert np.array_equal(arrays2.read(3), images[3]) and list(arrays2.labels) == [0, 1, 0, 1]
    assert set(Path("/dev/shm").glob("stoker_*")) == shm


@pytest.mark.ray
@skip_no_ray
@pytest.mark.timeout(180)
def test_cli_engine_ray_starts_and_stops_its_own_cluster(image_folder, tmp_path, capsys):
    import ray

    args = ["--shard-mb", "0.06", "--row-group-mb", "0.012", "--quiet"]
    assert main(["convert", str(image_folder), str(tmp_path / "local"), *args]) == 0
    assert (
        main(
            [
                "convert",
                str(image_folder),
                str(tmp_path / "ray"),
                *args,
                "--engine",
                "ray",
                "--workers",
                "2",
            ]
        )
        == 0
    )
    assert "36 images" in capsys.readouterr().out
    assert not ray.is_initialized()  # the cluster convert started is shut down again
    _assert_same_output(tmp_path / "local", tmp_path / "ray")


@pytest.mark.ray
@skip_no_ray
@pytest.mark.timeout(180)
def test_failed_shard_is_retried_then_named_and_a_rerun_resumes(image_folder, tmp_path):
    import ray

    dst = tmp_path / "ray"
    blocker = dst / STATE / f"{shard_name(1)}.json"
    blocker.mkdir(parents=True)  # the task for shard 1 cannot record itself: OSError, every try
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        with pytest.raises(StokerError, match=r"1 shard\(s\) failed after 3 Ray retries") as err:
            convert(image_folder, dst, engine="ray", workers=2, **SMALL)
        assert shard_name(1) in str(err.value) and "IsADirectoryError" in str(err.value)
        written = sorted(p.name for p in dst.glob("shard-*.parquet"))
        assert shard_name(1) not in written and len(written) >= 2  # the others are finished
        assert not (dst / MANIFEST).exists()

        blocker.rmdir()
        manifest = convert(image_folder, dst, engine="ray", workers=2, **SMALL)
        assert manifest["run"]["shards_built"] == 1
        assert manifest["rows"] == 36 and not list(dst.glob(".*.tmp"))
    finally:
        ray.shutdown()
