"""``stoker inspect``: what a source holds: counts, classes, image sizes and formats, bad files."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from .. import decode as dec
from ..decode.survey import Survey
from ..errors import DATA_ERRORS
from ..sources import open_source


def _probe_all(src: Any, survey: Survey | None) -> tuple[list[tuple[int, int]], Counter, list[str]]:
    """Sizes, formats and bad files of every sample; with a ``survey``, each is also decoded
    and classed (kind, outcome) in it."""
    sizes: list[tuple[int, int]] = []
    formats: Counter = Counter()
    bad: list[str] = []
    for i in range(len(src)):
        try:
            data = src.read(i)
            if isinstance(data, np.ndarray):
                sizes.append(data.shape[:2])
                formats["array"] += 1
                continue
            result = "" if survey is None else survey.add(src.name(i), bytes(data))[1]
            info = dec.probe(data)
            if result.startswith("refused"):
                dec.decode(data, info)  # raises the reason, listed below
        except DATA_ERRORS as exc:
            bad.append(f"{src.name(i)}: {type(exc).__name__}: {exc}")
            continue
        sizes.append((info.height, info.width))
        formats[info.format] += 1
    return sizes, formats, bad


def inspect_source(source: Any, decode: bool = False) -> str:
    """A readable summary of ``source``; headers only unless ``decode``."""
    src = open_source(source)
    lines = [f"{source}: {len(src)} samples"]
    counts: Any = np.bincount(src.labels[src.labels >= 0]) if (src.labels >= 0).any() else []
    names = src.classes or [str(i) for i in range(len(counts))]
    if len(counts):
        shown = ", ".join(f"{n}: {c}" for n, c in zip(names, counts, strict=False))
        lines.append(f"classes ({len(counts)}): {shown[:400]}")
    survey = Survey() if decode else None
    sizes, formats, bad = _probe_all(src, survey)
    if sizes:
        hw = np.asarray(sizes)
        h, w = hw[:, 0], hw[:, 1]
        lines.append(
            f"height min/median/max: {h.min()}/{int(np.median(h))}/{h.max()}; "
            f"width: {w.min()}/{int(np.median(w))}/{w.max()}"
        )
    lines.append("formats: " + ", ".join(f"{k} {v}" for k, v in formats.most_common()))
    lines.append(
        f"bad files: {len(bad)}" + ("" if decode else " (headers checked; --decode for all)")
    )
    lines += [f"  {b}" for b in bad[:50]]
    if survey is not None:
        lines += ["classes (kind | outcome):", *survey.lines()[1:]]
    return "\n".join(lines)
