"""The benchmarks' harness (benchmarks/common.py) and its theme scripts: rounds interleave their
peers (A B A B, never A A B B) after untimed warm-up rounds, ratios are taken against a baseline
of the same round, the median's interval covers what it says, ``--json`` writes one schema, and
every theme script lists its cases, parses each case's options and runs a tiny case end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
THEMES = ("throughput", "startup", "storage", "augment", "memory", "training")


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def common():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        import common as module

        yield module
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("common", None)


# --------------------------------------------------------------------------- the harness


def test_interleave_runs_the_peers_abab_after_untimed_warmup_rounds(common) -> None:
    calls: list[str] = []

    def peer(name: str, figures: list[float]) -> object:
        it = iter(figures)

        def measure() -> float:
            calls.append(name)
            return next(it)

        return common.Peer(name, measure)

    result = common.interleave(
        [peer("a", [0.0, 10, 20, 30]), peer("b", [0.0, 20, 20, 90])], rounds=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert result.values == {"a": [10, 20, 30], "b": [20, 20, 90]}
    assert result.stats("a")["median"] == 20
    # the median of the per-round ratios (2, 1, 3), not the ratio of the medians (20 / 20)
    assert result.ratio("b", "a")["median"] == 2.0
    assert result.ratio("a", "a")["median"] == 1.0
    with pytest.raises(ValueError, match="unique"):
        common.interleave([peer("a", []), peer("a", [])], rounds=1)


def test_a_peer_with_several_figures_gives_a_series_each(common) -> None:
    figures = iter([{"epoch": 2.0, "loading": 1.0}, {"epoch": 4.0, "loading": 3.0}])
    result = common.interleave([common.Peer("naive", lambda: next(figures))], rounds=2, warmup=0)
    assert result.values == {"naive: epoch": [2.0, 4.0], "naive: loading": [1.0, 3.0]}


def test_a_peer_that_skips_is_left_out_with_its_reason(common) -> None:
    calls: list[int] = []

    def flaky() -> float:
        calls.append(1)
        if len(calls) == 2:
            raise common.Skip("its process died")
        return 1.0

    peers = [common.Peer("ok", lambda: 2.0), common.Peer("flaky", flaky)]
    result = common.interleave(peers, rounds=3, warmup=0)
    assert len(calls) == 2 and result.values == {"ok": [2.0, 2.0, 2.0]}
    assert result.skipped == {"flaky": "its process died"}
    assert result.to_json()["skipped"] == {"flaky": "its process died"}


def test_median_interval_is_the_range_for_few_rounds_and_narrows_with_more(common) -> None:
    low, high, coverage = common.median_ci([5.0, 1.0, 3.0])
    assert (low, high) == (1.0, 5.0) and coverage == pytest.approx(0.75)
    low, high, coverage = common.median_ci([float(x) for x in range(20)])
    assert 0.95 <= coverage < 1.0 and 0 < low < 9.5 < high < 19


def test_json_has_one_schema_with_the_facts_at_both_ends(common, tmp_path: Path) -> None:
    result = common.Result({"x": [1.0, 2.0, 3.0], "y": [2.0, 2.0, 9.0]}, 3, 0)
    common.write_json(str(tmp_path / "out.json"), result.to_json("x"))
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["schema"] == common.SCHEMA
    assert set(out) == {"schema", "script", "case", "argv", "facts", "results"}
    for end in ("start", "end"):
        facts = out["facts"][end]
        assert len(facts["load_avg_1_5_15"]) == 3 and facts["usable_cores"] >= 1
        assert facts["stoker_commit"] and facts["decoder"]
    assert out["results"]["ratios"]["y"]["median"] == 2.0
    assert out["results"]["peers"]["y"]["values"] == [2.0, 2.0, 9.0]


# --------------------------------------------------------------------------- the theme scripts


def test_the_old_scripts_are_merged_into_the_theme_scripts() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py")}
    libraries = {"common", "peers", "photo_source", "s3local", "s3clients", "bucketbench"}
    assert scripts - libraries == {*THEMES, "cluster", "cluster_start", "gpu_check"}


def test_an_unknown_case_names_the_cases() -> None:
    proc = _run(str(BENCH / "memory.py"), "nosuch")
    assert proc.returncode == 2
    assert "unknown case 'nosuch'" in proc.stderr and "loader, arrays" in proc.stderr


PARSE_ALL = """
import sys
sys.path.insert(0, {bench!r})
theme = __import__({theme!r})
for name, (main, doc) in theme.CASES.items():
    assert name in theme.__doc__, name
    assert doc.strip(), name
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0, (name, exc.code)
    else:
        raise AssertionError(name + ": --help did not exit")
print("cases:", ",".join(theme.CASES))
"""


@pytest.mark.needs("torch")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("theme", THEMES)
def test_every_case_of_a_theme_script_parses_its_options(theme: str) -> None:
    proc = _run("-c", PARSE_ALL.format(bench=str(BENCH), theme=theme))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cases:" in proc.stdout
    listing = _run(str(BENCH / f"{theme}.py"), "--help")
    assert listing.returncode == 0 and "Cases" in listing.stdout


def _case(theme: str, *args: str, json_path: Path | None = None) -> dict | None:
    extra = ["--json", str(json_path)] if json_path else []
    proc = _run(str(BENCH / f"{theme}.py"), *args, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "machine:" in proc.stdout or json_path is None
    if json_path is None:
        return None
    out = json.loads(json_path.read_text())
    assert out["schema"] == "stoker-bench/1" and out["case"] == args[0]
    return out["results"]


@pytest.mark.timeout(300)
def test_throughput_gray_runs_its_rounds_on_the_harness(tmp_path: Path) -> None:
    results = _case(
        "throughput", "gray", "--rounds", "2", "--warmup", "0", json_path=tmp_path / "g.json"
    )
    assert results is not None and results["rounds"] == 2
    assert results["ratios"]["gray: rgb decode + luma (before)"]["median"] == 1.0
    assert all(p["median"] > 0 for p in results["peers"].values())


# (theme, case, options, writes --json): the smallest real run of a case; DATA is the test's
# image folder, TMP its temporary folder, ROWS a 3 MB file of random bytes in it.
SMALL_CASES = [
    (
        "throughput",
        "compare",
        "--data DATA --epochs 1 --batch-size 6 --workers 1 --only stoker --no-ceiling",
        True,
    ),
    ("memory", "loader", "--data DATA --epochs 3 --batch-size 6 --workers 1", True),
    ("storage", "page-cache", "--data DATA --rounds 1 --batch-size 6", True),
    ("storage", "mmap-hint", "ROWS --batch 4", True),
    (
        "storage",
        "clients",
        "--root TMP/s3 --objects 8 --shards 1 --shard-mb 2 --range-mb 0.5 --latency 0.01 "
        "--clients boto3,obstore --inflight 2 --seconds 0.3 --rounds 1",
        True,
    ),
    (
        "storage",
        "bucket",
        "--data DATA --root TMP/b --latency 0.01 --rounds 1 --warmup 0 --seconds 0.5 "
        "--batch-size 6 --workers 1 --peers stoker-folder,stoker-shards,mosaicml-streaming",
        True,
    ),
    (
        "storage",
        "s3-ceiling",
        "--root TMP/s3 --objects 8 --shards 1 --shard-mb 2 --range-mb 0.5 --clients obstore "
        "--endpoints s3local,s3local+proxy --inflight 2 --seconds 0.3 --rounds 1",
        True,
    ),
    ("startup", "files", "--files 300 --repeats 1 --root TMP/f --data DATA", True),
    ("augment", "ops", "DATA --workers 1 --batch 6 --epochs 1 --rounds 1 --calls 2", False),
    (
        "training",
        "overlap",
        "--data DATA --epochs 1 --batch-size 6 --workers 1 --only stoker",
        True,
    ),
    ("training", "keras-pad", "--folder TMP/kp --per-class 2", False),
    ("training", "elastic", "--data DATA --batch-size 4 --workers 1 --rounds 1", True),
]
NEEDS = {"ops": [pytest.mark.needs("torch")], "keras-pad": [pytest.mark.needs("keras")]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("theme", "case", "options", "writes_json"),
    [
        pytest.param(*row, id=f"{row[0]}-{row[1]}", marks=NEEDS.get(row[1], []))
        for row in SMALL_CASES
    ],
)
def test_the_smallest_run_of_a_case_ends_well(
    theme: str, case: str, options: str, writes_json: bool, tmp_path: Path, image_folder: Path
) -> None:
    (tmp_path / "rows").write_bytes(os.urandom(3_000_000) if "ROWS" in options else b"")
    args = options.replace("DATA", str(image_folder)).replace("TMP", str(tmp_path))
    args = args.replace("ROWS", str(tmp_path / "rows")).split()
    json_path = tmp_path / "out.json" if writes_json else None
    results = _case(theme, case, *args, json_path=json_path)
    assert results is not None or not writes_json


PARSE_DOCS = r"""
import argparse, re, shlex, sys
from pathlib import Path
root = Path({root!r})
sys.path.insert(0, str(root / "benchmarks"))


class Parsed(Exception):
    pass


def parse_only(self, args=None, namespace=None):
    _, extra = self.parse_known_args(args, namespace)
    if extra:
        self.error("unrecognized arguments: " + " ".join(extra))
    raise Parsed  # the options parse: stop before the case runs


argparse.ArgumentParser.parse_args = parse_only
pages = [root / "README.md", root / "benchmarks" / "README.md"]
pages += sorted((root / "docs").glob("*.md"))
found = []
for page in pages:
    text = page.read_text(encoding="utf-8")
    for block in re.findall(r"```.*?```", text, re.S):
        for m in re.finditer(r"python benchmarks/(\w+)\.py((?:[^\n]*\\\n)*[^\n]*)", block):
            found.append((page.name, m.group(1), m.group(2).replace("\\\n", " ")))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        for m in re.finditer(r"python benchmarks/(\w+)\.py([^;`]*)", span.replace("\n", " ")):
            found.append((page.name, m.group(1), m.group(2)))
bad, checked = [], 0
for page, script, rest in found:
    if script in ("cluster", "cluster_start", "gpu_check", "THEME"):
        continue  # single-case scripts of their own (gpu_check has its own test)
    rest = re.sub(r"\$\([^)]*\)", "FILE", rest.split(" #")[0]).replace("...", "")
    args = shlex.split(rest)
    theme = __import__(script)
    if not args or args[0] not in theme.CASES:
        bad.append(f"{{page}}: {{script}}.py {{rest.strip()}}: no case named")
        continue
    checked += 1
    try:
        theme.CASES[args[0]][0](args[1:])
        bad.append(f"{{page}}: {{script}}.py {{rest.strip()}}: ran instead of parsing")
    except Parsed:
        pass
    except SystemExit:
        bad.append(f"{{page}}: {{script}}.py {{rest.strip()}}: its options do not parse")
print("checked", checked)
assert not bad, "\n".join(bad)
"""


@pytest.mark.needs("torch")
@pytest.mark.timeout(300)
def test_every_benchmark_command_the_docs_cite_names_a_case_and_parses() -> None:
    proc = _run("-c", PARSE_DOCS.format(root=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert int(proc.stdout.split("checked")[-1]) >= 50


CLUSTER_KINDS = ("local", "remote", "local+remote", "remote_store")


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_the_smallest_cluster_run_starts_a_ray_cluster_and_writes_its_peers(
    tmp_path: Path, image_folder: Path
) -> None:
    pytest.importorskip("ray")
    out_path = tmp_path / "cluster.json"
    options = "--batch 6 --batches 2 --warmup 0 --rounds 1 --throttle none"
    proc = _run(
        str(BENCH / "cluster.py"),
        *options.split(),
        *("--data", str(image_folder), "--json", str(out_path)),
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "throttled node: not measured" in proc.stdout
    out = json.loads(out_path.read_text())
    assert out["schema"] == "stoker-bench/1" and out["script"] == "cluster.py"
    results = out["results"]
    assert [run["kind"] for run in results["runs"]] == list(CLUSTER_KINDS)
    assert results["throttled"] == [] and results["throttled_rounds"] is None
    peers = results["rounds"]["peers"]
    for kind in CLUSTER_KINDS:
        assert peers[f"{kind}: img_s"]["median"] > 0
        # the process's CPU times tick in 10 ms: 12 images may cost less than one tick
        assert peers[f"{kind}: trainer_cpu_ms"]["median"] >= 0
    for kind in CLUSTER_KINDS[1:]:  # the node's peers: the receiver's cost and the wire's bytes
        assert peers[f"{kind}: receive_ms"]["median"] > 0
        assert peers[f"{kind}: wire_bytes"]["median"] > 0


def test_the_cluster_throttle_falls_back_to_none_and_a_named_one_says_what_it_needs(
    common, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # cluster.py adds its folder again
    request.addfinalizer(lambda: sys.modules.pop("cluster", None))
    import cluster  # on the path the common fixture set

    monkeypatch.setattr(cluster, "cgroup_throttle_ok", lambda: False)
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)
    assert cluster.throttle_for("auto") == "none" and cluster.throttle_for("none") == "none"
    with pytest.raises(SystemExit, match="cpulimit installed"):
        cluster.throttle_for("cpulimit")
    monkeypatch.setattr(cluster.shutil, "which", lambda name: "/usr/bin/cpulimit")
    assert cluster.throttle_for("auto") == "cpulimit"


# --------------------------------------------------------------------------- the local S3 server


@pytest.fixture
def local_s3(common, tmp_path: Path):  # type: ignore[no-untyped-def]
    import s3local  # on the path the common fixture set

    (tmp_path / "bkt" / "a" / "b").mkdir(parents=True)
    for i in range(7):
        (tmp_path / "bkt" / "a" / f"{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    (tmp_path / "bkt" / "a" / "b" / "x y+z.txt").write_bytes(b"hello")
    (tmp_path / "bkt" / "top").write_bytes(os.urandom(5000))
    server = s3local.S3Local(str(tmp_path)).start()
    yield server, tmp_path / "bkt"
    server.shutdown()
    server.server_close()


def _s3_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.mark.timeout(120)
def test_the_local_s3_server_lists_ranges_and_stores_for_boto3_s3fs_and_obstore(
    local_s3, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3local

    pytest.importorskip("boto3")
    s3fs = pytest.importorskip("s3fs")
    obstore = pytest.importorskip("obstore")
    from obstore.store import S3Store

    server, bucket = local_s3
    for name, value in _s3_env(server.endpoint).items():
        monkeypatch.setenv(name, value)
    import boto3

    client = boto3.client("s3")
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket="bkt", Prefix="a/", PaginationConfig={"PageSize": 3}
    )
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert keys == [*(f"a/{i}.bin" for i in range(7)), "a/b/x y+z.txt"]
    top = client.list_objects_v2(Bucket="bkt", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/"]
    assert [o["Key"] for o in top["Contents"]] == ["top"]
    whole = (bucket / "top").read_bytes()
    got = client.get_object(Bucket="bkt", Key="top", Range="bytes=100-199")
    assert got["Body"].read() == whole[100:200] and got["ContentRange"] == "bytes 100-199/5000"
    assert client.head_object(Bucket="bkt", Key="a/3.bin")["ContentLength"] == 1003
    client.put_object(Bucket="bkt", Key="new/one.bin", Body=b"z" * 2_000_000)
    assert (bucket / "new" / "one.bin").read_bytes() == b"z" * 2_000_000
    with pytest.raises(client.exceptions.NoSuchKey):
        client.get_object(Bucket="bkt", Key="a/none")

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    assert fs.cat_file("bkt/a/b/x y+z.txt") == b"hello"
    assert fs.cat_file("bkt/top", start=10, end=20) == whole[10:20]
    assert sorted(fs.find("bkt/a")) == sorted(f"bkt/{k}" for k in keys)

    store = S3Store("bkt", client_options={"allow_http": True})
    assert bytes(obstore.get_range(store, "top", start=4990, end=5000)) == whole[-10:]
    assert bytes(obstore.get_range(store, "a/b/x y+z.txt", start=0, end=5)) == b"hello"
    listed = [m["path"] for chunk in obstore.list(store, "a") for m in chunk]
    assert sorted(listed) == keys
    tag = obstore.head(store, "top")["e_tag"]
    (bucket / "top").write_bytes(b"replaced")
    assert obstore.head(store, "top")["e_tag"] != tag  # a rewritten file is a new version
    assert s3local.counters(server.endpoint)["requests"]["GET"] >= 5  # the ranged and whole GETs
