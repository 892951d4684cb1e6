"""Survey images: what kind each file is, how stoker decodes it, and (optionally) how that
compares with Pillow, the reference; summed up by class. ``stoker inspect --decode`` reports
the kinds and outcomes; ``scripts/check_decode.py`` adds the comparison with Pillow.

A file's *kind* names what matters to a decoder: for a JPEG its coding process, sampling and
colour space (``jpeg progressive 4:4:1 ycbcr``), for the others the format and Pillow's mode,
plus ``animated``, ``oriented`` and ``trailing data`` where they apply. Its *outcome* is
``ok``, ``decoded with warnings`` or ``refused: <reason>``.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps

from ..errors import DecompressionBombError, StokerError
from . import decode, jpeg, probe
from .pillow import open_header

_SAMPLING = {
    (1, 1): "4:4:4",
    (2, 1): "4:2:2",
    (2, 2): "4:2:0",
    (1, 2): "4:4:0",
    (4, 1): "4:1:1",
    (4, 2): "4:1:0",
    (1, 4): "4:4:1",
}
_REASONS = (
    "decompression bomb",
    "not an image",
    "unsupported",
    "corrupt or truncated",
    "truncated",
    "corrupt",
)


def kind(data: bytes) -> str:
    """A short name of what this file is, for grouping (never raises)."""
    try:
        info = probe(data)
    except StokerError:
        return "unreadable header"
    extra = " oriented" if info.orientation != 1 else ""
    if info.format == "jpeg":
        return _jpeg_kind(data) + extra
    try:
        with open_header(data, info.format) as im:
            frames = getattr(im, "n_frames", 1)
            name = f"{info.format} {im.mode}" + (" animated" if frames > 1 else "")
    except Exception:  # noqa: BLE001 - a survey never stops on a file
        name = info.format
    return name + extra


def _jpeg_kind(data: bytes) -> str:
    header = jpeg.parse_header(data)
    if header.components == 3:
        luma, *chroma = header.sampling
        same = all(c == chroma[0] for c in chroma)
        sampling = _SAMPLING.get(luma, "x".join(map(str, luma))) if chroma[0] == (1, 1) else ""
        sampling = (
            sampling if same and sampling else "/".join(f"{h}x{v}" for h, v in header.sampling)
        )
    else:
        sampling = ""
    parts = ["jpeg", header.process, sampling, header.colorspace]
    end = bytes(data).find(b"\xff\xd9", header.scan)
    if 0 <= end < len(data) - 2:
        parts.append("trailing data")
    return " ".join(p for p in parts if p)


def outcome(data: bytes) -> tuple[str, str, np.ndarray | None]:
    """(class, detail, pixels): ``ok``, ``decoded with warnings`` or ``refused: <reason>``."""
    notes: list[str] = []
    try:
        image = np.ascontiguousarray(decode(data, notes=notes))
    except DecompressionBombError as exc:
        return "refused: decompression bomb", str(exc), None
    except StokerError as exc:
        text = str(exc)
        reason = next((r for r in _REASONS if r in text.lower()), "other")
        return f"refused: {reason}", text, None
    if notes:
        return "decoded with warnings", "; ".join(notes), image
    return "ok", "", image


def reference(data: bytes) -> np.ndarray | None:
    """Pillow's decode (first frame, EXIF/XMP-oriented, RGB), or None where Pillow fails."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    except Exception:  # noqa: BLE001 - Pillow raises many types on bad data
        return None


def compare(got: np.ndarray | None, ref: np.ndarray | None) -> str:
    """How stoker's pixels compare with Pillow's, as a class name."""
    if got is None:
        return "both refuse" if ref is None else "refused, Pillow decodes it"
    if ref is None:
        return "Pillow refuses, stoker decodes"
    if got.shape != ref.shape:
        return f"other shape than Pillow ({got.shape[:2]} vs {ref.shape[:2]})"
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    if not diff.any():
        return "same pixels as Pillow"
    if diff.mean() <= 1.0 and diff.max() <= 16:
        return "within 1 level of Pillow (mean)"
    return f"differs from Pillow (mean {diff.mean():.1f} levels)"


@dataclass
class Survey:
    """Counts of (kind, outcome[, comparison]) over files, and the first few names per class."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[tuple[str, ...], list[str]] = field(default_factory=dict)

    def add(self, name: str, data: bytes, against_pillow: bool = False) -> tuple[str, ...]:
        """Survey one file; returns its class key."""
        result, detail, image = outcome(data)
        key: tuple[str, ...] = (kind(data), result)
        if against_pillow:
            key += (compare(image, reference(data)),)
        self.counts[key] += 1
        shown = self.examples.setdefault(key, [])
        if len(shown) < 3:
            shown.append(f"{name}: {detail}" if detail else name)
        return key

    def lines(self, examples: bool = True) -> list[str]:
        """The summary: one line per class, most frequent first, with example files."""
        total = sum(self.counts.values())
        out = [f"decoded {total} files:"]
        for key, n in self.counts.most_common():
            out.append(f"  {n:6d}  {' | '.join(key)}")
            unusual = key[1] != "ok" or (len(key) > 2 and not key[2].startswith("same"))
            if examples and unusual:
                out += [f"            e.g. {e}" for e in self.examples[key][:2]]
        return out
