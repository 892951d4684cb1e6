"""``stoker convert``: any stoker source -> Parquet shards in the Hugging Face image layout.

Each shard ``shard-00000.parquet`` has the columns ``image: struct{bytes: binary, path: string}``
and ``label: int64``; the image bytes are stored uncompressed with PLAIN encoding, so every image
sits verbatim in the file and :class:`~stoker.sources.shards.ShardSource` reads one as an mmap
slice. Row groups hold about ``row_group_bytes`` of images, shards about ``shard_bytes``.

``DST`` may be a bucket URL (``s3://bucket/prefix``, any fsspec URL): see ``convert_bucket``.

The run can be interrupted and resumed: the sample -> shard assignment is fixed by a plan saved
in ``DST/.stoker-convert/plan.json`` before any shard is written; each shard is written under a
temporary name and renamed when complete, so a rerun keeps the finished shards and rebuilds only
the others. Unreadable or corrupt inputs are listed in ``DST/errors.csv`` and skipped. The
manifest ``DST/stoker-manifest.json`` (counts, classes, checksums, source fingerprint, stoker
version) is written last. Nothing here uses pickle: the state on disk is JSON and Parquet.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DATA_ERRORS, ConfigError
from ..sources import open_source
from ..sources.base import Indexed, ListedSizes, Source
from ..sources.names import FORM, to_text
from ..sources.store import is_url
from ..sources.targets import class_ids
from . import convert_bucket
from .convert_local import run_shards as run_local
from .outputs import output_folder
from .shard_writer import ERRORS, MANIFEST, STATE, prepare, shard_name, write_json

__all__ = ["convert", "MANIFEST", "ERRORS", "STATE", "shard_name"]

FORMAT = "stoker-shards"
FORMAT_VERSION = 2  # 2: names bytes-escaped (stoker.sources.names)
_SIZE_SAMPLES = 32  # samples read to estimate sizes when the source has no file paths


# ---------------------------------------------------------------------------- public entry


def convert(
    src: Any,
    dst: str | os.PathLike,
    *,
    max_side: int | None = None,
    quality: int | None = None,
    workers: int = 1,
    shard_bytes: int = 256 << 20,
    row_group_bytes: int = 4 << 20,
    progress: bool = True,
    shuffle_seed: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Convert the stoker source ``src`` into Parquet shards in ``dst``; return the manifest.

    ``max_side`` shrinks images whose longer side is larger (cv2 ``INTER_AREA``) and re-encodes
    them as JPEG at ``quality`` (default 90); ``quality`` alone re-encodes every image. Without
    either, image bytes are copied verbatim (decoded-array sources are stored as PNG).
    ``workers`` processes (:mod:`stoker.cli.convert_local`) each write whole shards, one at a
    time. ``shuffle_seed`` stores the samples in a seeded random order instead of the
    source's (worth it when the source is sorted by class and the shards will be read with
    the quasi-random block shuffle).

    ``engine="ray"`` writes each shard in a Ray task instead (:mod:`stoker.cli.convert_ray`; needs
    ``stoker[ray]``): same plan, same shards, same manifest. It joins the Ray cluster at
    ``ray_address`` unless Ray is already initialised; with neither, it starts a local one of
    ``workers`` CPUs for the run.
    """
    _check_args(max_side, quality, workers, shard_bytes, row_group_bytes)
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine must be 'local' or 'ray', got {engine!r}")
    if ray_address is not None and engine != "ray":
        raise ConfigError("ray_address is only used with engine='ray'")
    bucket = isinstance(dst, str) and is_url(dst)
    if bucket and engine == "ray":
        raise ConfigError(
            f"dst {dst}: engine='ray' writes shards on the cluster's nodes, into a folder they "
            "share; for a bucket, convert with engine='local' (or into a shared folder, then "
            "upload)"
        )
    if bucket:  # shards staged in a private folder, then uploaded (convert_bucket)
        store, out = convert_bucket.staging(str(dst))
    else:
        out = output_folder("dst", dst)  # before the source is scanned
    source = open_source(src)
    if class_ids(source.labels) is None:
        raise ConfigError(
            f"{src}: its labels are numeric targets ({source.labels.dtype}, shape "
            f"{source.labels.shape[1:]} per sample), and shards store int64 class ids: converting "
            "would truncate them; load this source directly with stoker.Loader"
        )
    if source.has_masks:
        if source is not src:
            source.close()
        raise ConfigError(
            f"{src}: a source of image,mask pairs cannot be converted to shards yet (the masks "
            "would be lost); load it directly with stoker.Loader"
        )
    try:
        manifest = _convert(
            source,
            out,
            max_side,
            quality,
            workers,
            shard_bytes,
            row_group_bytes,
            progress,
            shuffle_seed,
            engine,
            ray_address,
        )
        if bucket:
            convert_bucket.upload(store, out, str(dst), manifest)
        return manifest
    finally:
        if source is not src:
            source.close()


def _convert(
    source: Source,
    out: Path,
    max_side: int | None,
    quality: int | None,
    workers: int,
    shard_bytes: int,
    row_group_bytes: int,
    progress: bool,
    shuffle_seed: int | None,
    engine: str = "local",
    ray_address: str | None = None,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / STATE).mkdir(exist_ok=True)
    settings = {
        "max_side": max_side,
        "quality": quality,
        "shard_bytes": int(shard_bytes),
        "row_group_bytes": int(row_group_bytes),
        "shuffle_seed": shuffle_seed,
    }
    plan = _load_or_make_plan(source, out, settings)
    for stale in out.glob(".shard-*.parquet.tmp"):
        stale.unlink()
    todo, records = [], {}
    for number in range(len(plan["shards"])):
        record = _finished(out, number)
        if record is None:
            todo.append(number)
        else:
            records[number] = record
    t0 = time.perf_counter()
    total = sum(len(plan["shards"][k]) for k in todo)
    job = {"dst": str(out), "settings": settings}
    with _Progress(total, progress) as bar:
        if engine == "ray":
            from .convert_ray import run_shards  # imports ray, only for this engine

            records_done = run_shards(source, job, plan, todo, workers, bar, ray_address)
        else:
            records_done = run_local(source, job, plan, todo, workers, bar)
        for record in records_done:
            records[record["number"]] = record
    elapsed = time.perf_counter() - t0
    return _finish(source, out, plan, settings, records, len(todo), total, elapsed)


def _check_args(max_side, quality, workers, shard_bytes, row_group_bytes) -> None:
    if max_side is not None and (not isinstance(max_side, int) or max_side < 1):
        raise ConfigError(f"max_side must be a positive int or None, got {max_side!r}")
    if quality is not None and (not isinstance(quality, int) or not 1 <= quality <= 100):
        raise ConfigError(f"quality must be an int in 1..100 or None, got {quality!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    if shard_bytes < 1 or row_group_bytes < 1:
        raise ConfigError("shard_bytes and row_group_bytes must be positive byte counts")


# ---------------------------------------------------------------------------- the plan


def _load_or_make_plan(source: Source, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """The sample -> shard assignment: saved before any shard is written, reused on resume."""
    key = {"fingerprint": source.fingerprint(), "count": len(source), **settings}
    path = out / STATE / "plan.json"
    if path.exists():
        plan = json.loads(path.read_text())
        if plan.get("key") == key:
            return plan
        if any(out.glob("shard-*.parquet")):
            raise ConfigError(
                f"{out} holds shards of a different conversion (other source or settings: "
                f"{plan.get('key')} vs {key}); convert into an empty folder or delete it first"
            )
    samples = np.arange(len(source), dtype=np.int64)
    if settings["shuffle_seed"] is not None:
        gen = np.random.default_rng(np.random.SeedSequence([settings["shuffle_seed"], 0x5A4D]))
        samples = gen.permutation(samples)
    sizes = _estimated_sizes(source, samples, settings)
    starts = np.cumsum(sizes) - sizes
    shard_of = starts // settings["shard_bytes"]
    cuts = np.flatnonzero(np.diff(shard_of)) + 1
    shards = [part.tolist() for part in np.split(samples, cuts)] if len(samples) else []
    plan = {"key": key, "shards": shards}
    write_json(path, plan)
    return plan


def _estimated_sizes(source: Source, samples: np.ndarray, settings: dict[str, Any]) -> np.ndarray:
    """Bytes each sample will take in a shard: file sizes, or a mean from a few reads."""
    count = len(samples)
    if isinstance(source, ListedSizes) and source.sizes.shape == (len(source),) and count:
        sizes = np.maximum(source.sizes[samples], 0).astype(np.int64)
    elif isinstance(source, Indexed) and count:
        sizes = np.empty(count, dtype=np.int64)
        for k, i in enumerate(samples):
            try:
                sizes[k] = os.stat(source.index.path(int(i))).st_size
            except OSError:
                sizes[k] = 0
    else:
        sizes = np.full(count, max(1, _mean_size(source, samples, settings, raw=True)), np.int64)
    if count and (settings["max_side"] is not None or settings["quality"] is not None):
        raw = _mean_size(source, samples, settings, raw=True)
        new = _mean_size(source, samples, settings, raw=False)
        sizes = (sizes * (new / max(raw, 1))).astype(np.int64)
    return np.maximum(sizes, 1)


def _mean_size(source: Source, samples: np.ndarray, settings: dict[str, Any], raw: bool) -> int:
    """Mean stored size of up to _SIZE_SAMPLES evenly spaced samples (raw or as they'd be put)."""
    picks = samples[np.linspace(0, len(samples) - 1, min(_SIZE_SAMPLES, len(samples))).astype(int)]
    total = seen = 0
    for i in picks:
        try:
            data = source.read(int(i))
            if raw and not isinstance(data, np.ndarray):
                total += len(data)
            else:
                total += len(prepare(data, settings["max_side"], settings["quality"]))
            seen += 1
        except DATA_ERRORS:
            continue
    return total // seen if seen else 100_000


# ---------------------------------------------------------------------------- resume, finish


def _finished(out: Path, number: int) -> dict[str, Any] | None:
    """The record of a shard completed by an earlier run, or None if it must be (re)built."""
    final = out / shard_name(number)
    rec_path = out / STATE / f"{final.name}.json"
    if not final.exists() or not rec_path.exists():
        return None
    try:
        record = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("bytes") != final.stat().st_size:
        return None
    return record


def _finish(
    source: Source,
    out: Path,
    plan: dict[str, Any],
    settings: dict[str, Any],
    records: dict[int, dict[str, Any]],
    built: int,
    converted: int,
    elapsed: float,
) -> dict[str, Any]:
    """Write errors.csv, then the manifest (last); return the manifest."""
    import stoker

    numbers = sorted(records)
    errors = [(shard_name(n), *e) for n in numbers for e in records[n]["errors"]]
    tmp = out / (ERRORS + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["shard", "index", "name", "reason"])
        w.writerows(errors)
    os.replace(tmp, out / ERRORS)
    shards = [
        {k: records[n][k] for k in ("file", "rows", "bytes", "sha256", "row_groups")}
        for n in numbers
    ]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "stoker_version": stoker.__version__,
        "source": {
            "fingerprint": source.fingerprint(),
            "kind": type(source).__name__,
            "samples": len(source),
        },
        "classes": [to_text(c) for c in source.classes] if source.classes else source.classes,
        "names": FORM,
        "rows": sum(s["rows"] for s in shards),
        "label_counts": _total_counts(records[n]["labels"] for n in numbers),
        "errors": len(errors),
        "settings": settings,
        "columns": {
            "image": "struct{bytes: binary (uncompressed, PLAIN), path: string}",
            "label": "int64",
        },
        "shards": shards,
        "run": {
            "shards_built": built,
            "shards_kept": len(numbers) - built,
            "samples_converted": converted,
            "seconds": round(elapsed, 3),
            "images_per_s": round(converted / elapsed, 1) if elapsed > 0 else None,
        },
    }
    write_json(out / MANIFEST, manifest)
    return manifest


def _total_counts(parts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for key, count in part.items():
            total[key] = total.get(key, 0) + count
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


# ---------------------------------------------------------------------------- progress


class _Progress:
    """tqdm when installed; otherwise a line on stderr every few seconds with rate and ETA."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = total, enabled and total > 0, 0
        self.t0 = self.last = time.perf_counter()
        self._bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, unit="img", desc="stoker convert", smoothing=0.1)

    def add(self, count: int) -> None:
        self.done += count
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(count)
            return
        now = time.perf_counter()
        if now - self.last >= 5.0 or self.done >= self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            print(
                f"stoker convert: {self.done}/{self.total} images, {rate:,.0f} img/s, "
                f"ETA {eta:,.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
