"""One Parquet shard of ``stoker convert``: prepare each image's bytes, write the row groups
under a temporary name, checksum, record and rename.

Both engines (local processes in :mod:`stoker.cli.convert`, Ray tasks in
:mod:`stoker.cli.convert_ray`) write shards with :func:`write_shard`, so their shards are
byte-identical; this module imports neither of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._compat import file_sha256
from ..errors import DATA_ERRORS, DecodeError, one_line
from ..sources.base import Indexed, Source
from ..sources.names import FORM, KEY, to_text

__all__ = [
    "write_shard",
    "image_schema",
    "prepare",
    "shard_name",
    "tmp_name",
    "write_json",
    "ERRORS",
    "MANIFEST",
    "STATE",
    "DEFAULT_QUALITY",
]

MANIFEST = "stoker-manifest.json"  # written last: its presence says the shards are whole
ERRORS = "errors.csv"  # the samples left out, with their reason
STATE = ".stoker-convert"  # folder in DST for the plan and the per-shard records
DEFAULT_QUALITY = 90  # JPEG quality when re-encoding and no quality is given
_TICK = 16  # a worker reports progress every this many samples


def shard_name(number: int) -> str:
    """The file name of shard ``number``: ``shard-00000.parquet``."""
    return f"shard-{number:05d}.parquet"


def tmp_name(number: int) -> str:
    """The temporary name shard ``number`` is written under until it is complete."""
    return f".{shard_name(number)}.tmp"


def write_shard(
    source: Source, job: dict[str, Any], number: int, samples: list[int], tick: Any
) -> dict[str, Any]:
    """Write one shard to its temporary name, checksum it, record it, rename it."""
    import pyarrow.parquet as pq

    out = Path(job["dst"])
    settings = job["settings"]
    tmp, final = out / tmp_name(number), out / shard_name(number)
    schema = image_schema(source.classes)
    writer = pq.ParquetWriter(
        tmp,
        schema,
        compression={"image.bytes": "NONE", "image.path": "SNAPPY", "label": "SNAPPY"},
        use_dictionary=["label"],
        write_statistics=["label"],
    )
    rows: list[tuple[bytes, str, int]] = []
    buffered, groups, errors, written, unticked = 0, [], [], 0, 0
    try:
        for i in samples:
            unticked += 1
            if unticked >= _TICK:
                tick(unticked)
                unticked = 0
            try:
                data = prepare(source.read(i), settings["max_side"], settings["quality"])
            except DATA_ERRORS as exc:
                errors.append([i, to_text(source.name(i)), to_text(one_line(exc))])
                continue
            rows.append((data, _path_of(source, i), int(source.labels[i])))
            buffered += len(data)
            if buffered >= settings["row_group_bytes"]:
                groups.append(_flush(writer, schema, rows))
                written += len(rows)
                rows, buffered = [], 0
        if rows:
            groups.append(_flush(writer, schema, rows))
            written += len(rows)
    finally:
        writer.close()
        if unticked:
            tick(unticked)
    record = {
        "number": number,
        "file": final.name,
        "rows": written,
        "row_groups": groups,
        "bytes": tmp.stat().st_size,
        "sha256": _sha256(tmp),
        "errors": errors,
        "labels": _label_counts(source.labels, samples, errors),
    }
    write_json(out / STATE / f"{final.name}.json", record)
    os.replace(tmp, final)
    return record


def image_schema(classes: list[str] | None) -> Any:
    """The Arrow schema of a shard, with Hugging Face ``datasets`` feature metadata; its names
    (class names here, the ``image.path`` column) are bytes-escaped (``stoker.sources.names``)."""
    import pyarrow as pa

    label: dict[str, Any] = {"dtype": "int64", "_type": "Value"}
    if classes:
        label = {"names": [to_text(c) for c in classes], "_type": "ClassLabel"}
    features = {"image": {"_type": "Image"}, "label": label}
    meta = {
        b"huggingface": json.dumps({"info": {"features": features}}).encode(),
        KEY: FORM.encode(),
    }
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.schema([pa.field("image", image), pa.field("label", pa.int64())], metadata=meta)


def _flush(writer: Any, schema: Any, rows: list[tuple[bytes, str, int]]) -> int:
    """Write ``rows`` as one row group; return its row count."""
    import pyarrow as pa

    image = pa.StructArray.from_arrays(
        [pa.array([r[0] for r in rows], pa.binary()), pa.array([r[1] for r in rows], pa.string())],
        fields=list(schema.field("image").type),
    )
    table = pa.Table.from_arrays([image, pa.array([r[2] for r in rows], pa.int64())], schema=schema)
    writer.write_table(table, row_group_size=len(rows))
    return len(rows)


def prepare(data: bytes | np.ndarray, max_side: int | None, quality: int | None) -> bytes:
    """The bytes to store for one sample: verbatim when allowed, else decoded and re-encoded."""
    import cv2
    import simplejpeg

    from ..decode import decode, probe

    if isinstance(data, np.ndarray):
        image = _rgb(data)
    else:
        info = probe(data)  # refuses non-images and decompression bombs
        fits = max_side is None or max(info.height, info.width) <= max_side
        if quality is None and fits:
            return bytes(data)
        target = None
        if not fits and max_side is not None:
            scale = max_side / max(info.height, info.width)
            target = (max(1, round(info.height * scale)), max(1, round(info.width * scale)))
        image = decode(data, info, min_size=target)  # reduced DCT scale when it shrinks anyway
    h, w = image.shape[:2]
    if max_side is not None and max(h, w) > max_side:
        scale = max_side / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    image = np.ascontiguousarray(image)
    if isinstance(data, np.ndarray) and quality is None:
        ok, png = cv2.imencode(".png", image[..., ::-1])  # lossless for decoded arrays
        if not ok:
            raise DecodeError("cannot encode this array as PNG")
        return png.tobytes()
    return simplejpeg.encode_jpeg(image, quality=quality or DEFAULT_QUALITY, colorspace="RGB")


def _rgb(array: np.ndarray) -> np.ndarray:
    if array.ndim == 2 or (array.ndim == 3 and array.shape[2] == 1):
        return np.repeat(array.reshape(array.shape[0], array.shape[1], 1), 3, axis=2)
    return array[..., :3]


def _path_of(source: Source, i: int) -> str:
    return to_text(source.index.relative(i) if isinstance(source, Indexed) else source.name(i))


def _label_counts(labels: np.ndarray, samples: list[int], errors: list[list[Any]]) -> dict:
    """Rows per label among the samples written (JSON keys are the label numbers)."""
    bad = {e[0] for e in errors}
    kept = np.asarray([labels[i] for i in samples if i not in bad], dtype=np.int64)
    values, counts = np.unique(kept, return_counts=True)
    return {str(v): int(c) for v, c in zip(values, counts, strict=True)}


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return file_sha256(f)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
