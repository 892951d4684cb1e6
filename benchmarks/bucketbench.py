"""The code of ``storage.py bucket``: the same images in each loader's own format in a local
bucket (served by ``benchmarks/s3local.py`` with a first-byte latency and a per-connection
bandwidth cap), each loader timed in a fresh process with the same work.

A run (``python benchmarks/bucketbench.py run PEER ...``, what the case starts) prints one JSON
line: images delivered and wall/CPU seconds after the first batch, and the server's GETs and
body bytes over the same span (``GET /?counters``), so GETs per image and bytes fetched per
byte decoded are counted the same way for every peer. The peers:

- ``stoker-local``: ``stoker.Loader`` on the local folder, warm (the baseline);
- ``stoker-folder`` / ``stoker-shards``: ``Loader("s3://bench/folder/")`` (one object per
  image) and ``Loader("s3://bench/shards/")`` (``stoker convert`` Parquet shards);
- ``litdata``: litdata's ``StreamingDataset`` over chunks written by ``litdata.optimize``, in
  its ``StreamingDataLoader``;
- ``s3torchconnector``: ``S3MapDataset.from_prefix`` of the folder in a torch ``DataLoader``;
- ``webdataset``: ``wds.WebDataset`` over tar shards of the same images (read whole, over the
  server's plain HTTP GETs: its ``pipe:`` openers need a CLI such as the AWS CLI otherwise),
  in a ``wds.WebLoader``;
- ``mosaicml-streaming``: cannot be installed beside torch 2.13.0+cpu (`MOSAIC_SKIP`).

Same work everywhere: decode, RandomResizedCrop 224 (torchvision's parameters), flip, batches
of ``--batch-size``, ``--workers`` worker processes; the peers decode with simplejpeg + cv2
(``peers.cv_sample``'s work from bytes), stoker with its own decoder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import s3clients  # noqa: E402
import s3local  # noqa: E402

BUCKET = "bench"
LAYOUTS = ("folder", "shards", "tars", "litdata")
MOSAIC_SKIP = (
    "mosaicml-streaming 0.13.0 cannot run beside torch 2.13.0+cpu: `import streaming` imports "
    "torchvision (streaming/vision), and PyPI's torchvision 0.28.0 for torch 2.13 is a CUDA "
    "build whose _C.so does not load with the +cpu torch (RuntimeError: operator "
    "torchvision::nms does not exist); it also pins numpy<2.2, google-cloud-storage<3.3 and "
    "transformers<5, below this project's constraints"
)

# ---------------------------------------------------------------------------- conversion


NEEDS = {"stoker-folder": "folder", "s3torchconnector": "folder", "stoker-shards": "shards"}
NEEDS.update({"webdataset": "tars", "litdata": "litdata"})


def convert_all(images: Path, root: Path, peers: list[str], tar_mb: int = 64) -> dict[str, float]:
    """Write ``images`` in the layouts ``peers`` read under ``root/bench`` (kept when done
    before: the seconds they took then); the seconds each conversion took. litdata's chunks
    only where litdata is installed."""
    base = root / BUCKET
    base.mkdir(parents=True, exist_ok=True)
    took: dict[str, float] = {}
    for layout in dict.fromkeys(NEEDS[p] for p in peers if p in NEEDS):
        if layout == "litdata" and importlib.util.find_spec("litdata") is None:
            continue
        done = base / f".{layout}.done"
        if done.is_file():
            took[layout] = float(done.read_text())
            continue
        target = base / layout
        if target.exists():
            shutil.rmtree(target)
        t0 = time.perf_counter()
        if layout == "folder":
            shutil.copytree(images, target)
        elif layout == "shards":
            from stoker.cli.convert import convert

            convert(images, target, progress=False)
        elif layout == "tars":
            write_tars(images, target, tar_mb)
        else:
            write_litdata(images, target)
        took[layout] = time.perf_counter() - t0
        done.write_text(f"{took[layout]:.1f}")
        print(f"  {layout}: written in {took[layout]:.1f} s", flush=True)
    return took


def _items(images: Path) -> list[tuple[str, int]]:
    import common

    return common.list_items(images)


def write_tars(images: Path, target: Path, tar_mb: int) -> None:
    """WebDataset shards: ``{key}.jpg`` and ``{key}.cls`` per image, in a shuffled order."""
    items = _items(images)
    random.Random(0).shuffle(items)
    target.mkdir(parents=True)
    shard, size, out = 0, 0, None
    for i, (path, label) in enumerate(items):
        if out is None or size >= tar_mb * 1e6:
            if out is not None:
                out.close()
            out = tarfile.open(target / f"shard-{shard:05d}.tar", "w")
            shard, size = shard + 1, 0
        data = Path(path).read_bytes()
        for name, blob in ((f"{i:07d}.jpg", data), (f"{i:07d}.cls", str(label).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            out.addfile(info, _reader(blob))
        size += len(data)
    if out is not None:
        out.close()


def _reader(blob: bytes) -> Any:
    import io

    return io.BytesIO(blob)


def _lit_sample(item: tuple[str, int]) -> dict[str, Any]:
    return {"image": Path(item[0]).read_bytes(), "label": item[1]}


def write_litdata(images: Path, target: Path) -> None:
    """litdata's own chunks (``litdata.optimize``: the JPEG bytes and the label per sample)."""
    from litdata import optimize

    optimize(
        fn=_lit_sample,
        inputs=_items(images),
        output_dir=str(target),
        chunk_bytes="32MB",
        num_workers=1,
        mode="overwrite",
    )


# ---------------------------------------------------------------------------- one run


def cv_bytes(data: bytes, size: int, rng: Any) -> Any:
    """``peers.cv_sample``'s work on bytes: simplejpeg decode, RandomResizedCrop, flip."""
    import cv2
    import peers
    import simplejpeg

    img = simplejpeg.decode_jpeg(data, colorspace="RGB")
    left, top, w, h = peers.rrc_box(img.shape[1], img.shape[0], rng)
    out = cv2.resize(
        img[top : top + h, left : left + w], (size, size), interpolation=cv2.INTER_LINEAR
    )
    return cv2.flip(out, 1) if rng.random() < 0.5 else out


def _init_worker(_: int) -> None:
    import cv2

    cv2.setNumThreads(1)


def stoker_stream(peer: str, root: Path, images: Path, batch: int, workers: int) -> Any:
    import stoker

    source = str(images) if peer == "stoker-local" else f"s3://{BUCKET}/{peer.split('-')[1]}/"
    loader = stoker.Loader(
        source, batch_size=batch, image_size=224, augment="train", workers=workers, seed=0
    )
    return loader.stream(), loader


class _S3Sample:
    """s3torchconnector's transform: the object's bytes -> (augmented image, label)."""

    def __init__(self, classes: dict[str, int]) -> None:
        self.classes = classes

    def __call__(self, obj: Any) -> tuple[Any, int]:
        label = self.classes[obj.key.split("/")[-2]]
        return cv_bytes(obj.read(), 224, random), label


def torch_stream(peer: str, endpoint: str, images: Path, batch: int, workers: int) -> Any:
    import torch
    from torch.utils.data import DataLoader

    kw: dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    kw["worker_init_fn"] = _init_worker
    if peer == "s3torchconnector":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        classes = {
            p.name: i for i, p in enumerate(sorted(d for d in images.iterdir() if d.is_dir()))
        }
        data = S3MapDataset.from_prefix(
            f"s3://{BUCKET}/folder/",
            region="us-east-1",
            endpoint=endpoint,
            transform=_S3Sample(classes),
            s3client_config=S3ClientConfig(force_path_style=True),
        )
        gen = torch.Generator().manual_seed(0)
        loader = DataLoader(
            data, batch_size=batch, shuffle=True, drop_last=True, generator=gen, **kw
        )
    elif peer == "litdata":
        loader = _litdata_loader(endpoint, batch, kw)
    else:
        loader = _wds_loader(endpoint, batch, kw)

    def endless() -> Any:
        while True:
            yield from loader

    return endless(), None


def _litdata_loader(endpoint: str, batch: int, kw: dict[str, Any]) -> Any:
    import litdata.streaming.downloader as downloader
    from litdata import StreamingDataLoader, StreamingDataset

    # litdata's chunk prefetch builds its own obstore client, with fixed options that do not
    # allow plain http: allow it (as AWS_ALLOW_HTTP does for obstore) to reach the local server
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

    class Decoded(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: Any) -> tuple[Any, int]:
            item = super().__getitem__(index)
            return cv_bytes(item["image"], 224, random), int(item["label"])

    options = {"endpoint_url": endpoint, **_boto_keys()}
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"litdata-cache-{os.getpid()}"
    data = Decoded(
        f"s3://{BUCKET}/litdata", storage_options=options, shuffle=True, cache_dir=str(cache)
    )
    kw.pop("worker_init_fn")
    return StreamingDataLoader(data, batch_size=batch, drop_last=True, **kw)


def _wds_loader(endpoint: str, batch: int, kw: dict[str, Any]) -> Any:
    import webdataset as wds

    names = sorted(p.name for p in (Path(os.environ["BENCH_ROOT"]) / BUCKET / "tars").glob("*.tar"))
    urls = [f"{endpoint}/{BUCKET}/tars/{n}" for n in names]
    data = (
        wds.WebDataset(
            urls, shardshuffle=len(urls), workersplitter=wds.split_by_worker, empty_check=False
        )
        .shuffle(1000)
        .to_tuple("jpg", "cls")
        .map(lambda s: (cv_bytes(s[0], 224, random), int(s[1])))
        .batched(batch, partial=False)
    )
    kw.pop("persistent_workers")
    return wds.WebLoader(data, batch_size=None, **kw)


def _boto_keys() -> dict[str, str]:
    return {
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }


def run(
    peer: str, endpoint: str, root: Path, images: Path, seconds: float, batch: int, workers: int
) -> dict[str, Any]:
    """One timed run of ``peer`` in this process: ``seconds`` after its first batch."""
    import common

    os.environ["BENCH_ROOT"] = str(root)
    t0 = time.perf_counter()
    if peer.startswith("stoker"):
        stream, loader = stoker_stream(peer, root, images, batch, workers)
    else:
        stream, loader = torch_stream(peer, endpoint, images, batch, workers)
    common.batch_len(next(stream))
    first = time.perf_counter() - t0
    before = s3local.counters(endpoint) if endpoint else None
    cpu0, t1, n = common.tree_cpu(), time.perf_counter(), 0
    while time.perf_counter() - t1 < seconds:
        n += common.batch_len(next(stream))
    wall, cpu = time.perf_counter() - t1, common.tree_cpu() - cpu0
    out: dict[str, Any] = {"images": n, "seconds": wall, "cpu_s": cpu, "first_batch_s": first}
    if before is not None:
        after = s3local.counters(endpoint)
        out["gets"] = after["requests"].get("GET", 0) - before["requests"].get("GET", 0)
        out["bytes"] = after["bytes_out"] - before["bytes_out"]
    if loader is not None:
        out["stats"] = str(loader.stats())
        loader.close()
    return out


def run_child(
    peer: str,
    endpoint: s3clients.Endpoint | None,
    root: Path,
    images: Path,
    seconds: float,
    batch: int,
    workers: int,
) -> dict[str, Any]:
    """`run` in a fresh process; a failure is the peer's `common.Skip` with its stderr's end."""
    import common

    url = endpoint.url if endpoint else ""
    cmd = [sys.executable, __file__, "run", peer, url, str(root), str(images), str(seconds)]
    cmd += [str(batch), str(workers)]
    env = {**os.environ, **(endpoint.env() if endpoint else {})}
    env["XDG_CACHE_HOME"] = str(root / "cache")
    # a fresh temporary folder per run, removed after it (litdata's chunk cache goes there):
    # no run writes behind the next one's back, and nothing piles up over the rounds
    env["TMPDIR"] = tempfile.mkdtemp(prefix="run-", dir=root)
    # its own process group, ended with it: a peer's process that outlived the run (litdata's)
    # wrote its chunk cache into the removed folder behind the next runs' backs
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=seconds + 600)
    except subprocess.TimeoutExpired:
        raise common.Skip(f"{peer}: no result within {seconds + 600:.0f} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    if proc.returncode:
        tail = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
        raise common.Skip(f"{peer} failed ({proc.returncode}): {' | '.join(tail)[-600:]}")
    return dict(json.loads(stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------------- the case

BUCKET_DOC = """\
Data in a bucket: stoker (an ImageFolder of objects, and Parquet shards) vs litdata, MosaicML
Streaming, s3torchconnector + DataLoader and WebDataset, each on its own format in one local
bucket behind a first-byte latency and a per-connection bandwidth cap; stoker on the local
warm folder as the baseline.

What it does
1. Writes ``--data`` (an ImageFolder; the ImageNet-like set is made there with
   ``/work/shared/make_dataset.py --classes 10 --per-class 300`` if missing) under
   ``--root``/bench in every loader's format: the folder as is, ``stoker convert`` shards,
   WebDataset tars, litdata chunks (``litdata.optimize``); each conversion's time is reported
   apart (and the layouts are reused by later runs).
2. Serves the bucket from ``benchmarks/s3local.py`` (moto's server is too slow: ``storage.py
   s3-ceiling``), a fresh server for every run, with ``--latency`` seconds to each answer's
   first byte and each connection capped at ``--bandwidth`` bytes/s.
3. Reads the data each run will read once just before it (``warm``: this VM pages out file
   pages unused for a minute), then times every peer in a fresh process for ``--seconds``
   after its first batch (same work:
   decode, RandomResizedCrop 224, flip, batch ``--batch-size``, ``--workers`` workers),
   the peers interleaved in rounds (`common.interleave`); a peer that cannot run is skipped
   with its reason (MosaicML Streaming always: `MOSAIC_SKIP`).
4. Reports per peer: img/s, img per CPU second of its process tree, GETs per image and bytes
   fetched per byte decoded (both counted at the server over the timed span), the seconds
   from the loader's construction to its first batch, and the goals as ratios of the same
   rounds.

Usage
    python benchmarks/storage.py bucket --latency 0.02 0.05 0.1 --rounds 2 --seconds 20
"""

FIGURES = ("img/s", "img/CPU-s", "GETs/img", "fetched/decoded", "first batch s")


def bucket_main(argv: list[str] | None = None) -> int:
    import argparse

    import common

    ap = argparse.ArgumentParser(description=BUCKET_DOC.split("\n\n")[0])
    common.add_round_options(ap, rounds=2, seconds=20.0)
    ap.add_argument("--data", default="/tmp/stoker-bucket/images", help="ImageFolder")
    ap.add_argument("--root", default="/tmp/stoker-bucket", help="where the bucket is written")
    ap.add_argument("--latency", type=float, nargs="+", default=[0.02, 0.05, 0.1])
    ap.add_argument("--bandwidth", type=float, default=50e6, help="bytes/s per connection")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated")
    args = ap.parse_args(argv)
    common.print_facts()
    images, root = Path(args.data), Path(args.root)
    if not (images / "labels.csv").is_file():
        make = [sys.executable, "/work/shared/make_dataset.py", "--out", str(images)]
        subprocess.run([*make, "--classes", "10", "--per-class", "300"], check=True)
    chosen = args.peers.split(",")
    converted = convert_all(images, root, chosen)
    sizes = [os.path.getsize(p) for p, _ in _items(images)]
    mean_bytes = sum(sizes) / len(sizes)
    print("conversion s: " + ", ".join(f"{k} {v:.1f}" for k, v in converted.items()))
    peers = _peers(args.peers.split(","), root, images, args, mean_bytes)
    result = common.interleave(peers, args.rounds, args.warmup, progress="{:,.2f}")
    _report(result, args.latency, mean_bytes)
    common.write_json(
        args.json, {**result.to_json(), "conversion_s": converted, "mean_jpeg_bytes": mean_bytes}
    )
    return 0


PEERS = (
    "stoker-folder",
    "stoker-shards",
    "litdata",
    "s3torchconnector",
    "webdataset",
    "mosaicml-streaming",
)


def warm(folder: Path) -> None:
    """Read every file under ``folder`` once, so a run starts with its data in the page cache:
    this VM pages out file pages unused for a minute (DAMON ``pageout``), so a layout last read
    a round ago would otherwise be served partly from disk, and the local baseline read partly
    cold."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass


def _peers(chosen: list[str], root: Path, images: Path, args: Any, mean_bytes: float) -> list[Any]:
    """One ``common.Peer`` per loader and latency; every run gets its data read just before
    it (``warm``) and a fresh server, so no run inherits another's state."""
    import common

    def measure(peer: str, latency: float | None) -> Any:
        def one() -> dict[str, float]:
            if peer == "mosaicml-streaming":
                raise common.Skip(MOSAIC_SKIP)
            warm(images if latency is None else root / BUCKET / NEEDS[peer])
            ep = None
            if latency is not None:
                ep = s3clients.Endpoint("s3local", root, latency, args.bandwidth)
            try:
                r = run_child(peer, ep, root, images, args.seconds, args.batch_size, args.workers)
            finally:
                if ep is not None:
                    ep.close()
            n = max(1, r["images"])
            out = {"img/s": r["images"] / r["seconds"], "img/CPU-s": n / max(r["cpu_s"], 1e-9)}
            out["first batch s"] = r["first_batch_s"]  # from the loader's construction
            if ep is not None:
                out["GETs/img"] = r["gets"] / n
                out["fetched/decoded"] = r["bytes"] / (n * mean_bytes)
            return out

        return one

    peers = [common.Peer("stoker-local", measure("stoker-local", None))]
    for lat in args.latency:
        peers += [common.Peer(f"{p} {lat * 1000:g} ms", measure(p, lat)) for p in chosen]
    return peers


def _report(result: Any, latencies: list[float], mean_bytes: float) -> None:
    import common

    rows = []
    for name in dict.fromkeys(n.rsplit(": ", 1)[0] for n in result.values):
        med = {
            f: result.stats(f"{name}: {f}")["median"]
            for f in FIGURES
            if f"{name}: {f}" in result.values
        }
        rows.append([name, *(f"{med[f]:,.2f}" if f in med else "-" for f in FIGURES)])
    print(common.table(rows, ["peer", *FIGURES]))
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason[:400]}")
    lat = 0.05 if 0.05 in latencies else latencies[0]
    tag = f"{lat * 1000:g} ms"

    def med(name: str, figure: str = "img/s") -> float:
        key = f"{name}: {figure}"
        return result.stats(key)["median"] if key in result.values else float("nan")

    layouts = [med(f"stoker-folder {tag}"), med(f"stoker-shards {tag}")]
    best_stoker = max((x for x in layouts if x == x), default=float("nan"))  # the peers run
    others = [med(f"{p} {tag}") for p in PEERS if not p.startswith("stoker")]
    best_peer = max((x for x in others if x == x), default=float("nan"))
    lines = [
        common.ratio_line(
            f"stoker bucket / stoker local, {tag}", best_stoker, med("stoker-local"), ">= 0.9"
        ),
        common.ratio_line(f"stoker bucket / best peer, {tag}", best_stoker, best_peer, ">= 1.5"),
        common.ratio_line(
            f"GETs per image, shards, {tag}",
            med(f"stoker-shards {tag}", "GETs/img"),
            1.0,
            "<= 0.05",
        ),
        common.ratio_line(
            f"GETs per image, folder, {tag}", med(f"stoker-folder {tag}", "GETs/img"), 1.0, "<= 1"
        ),
        common.ratio_line(
            f"fetched / decoded, shards, {tag}",
            med(f"stoker-shards {tag}", "fetched/decoded"),
            1.0,
            "<= 1.05",
        ),
        common.ratio_line(
            f"fetched / decoded, folder, {tag}",
            med(f"stoker-folder {tag}", "fetched/decoded"),
            1.0,
            "<= 1.05",
        ),
    ]
    print(common.table(lines, ["goal (medians)", "value", "goal", "verdict"]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] != "run":
        return bucket_main(args)
    if len(args) != 8:
        raise SystemExit(
            "usage: bucketbench.py run PEER ENDPOINT ROOT IMAGES SECONDS BATCH WORKERS"
        )
    _, peer, url, root, images, seconds, batch, workers = args
    out = run(peer, url, Path(root), Path(images), float(seconds), int(batch), int(workers))
    print(json.dumps(out), flush=True)
    os._exit(0)  # the peers' loader threads and worker pools are not ours to wait for


if __name__ == "__main__":
    sys.exit(main())
