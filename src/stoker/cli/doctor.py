"""``stoker doctor``: the machine facts that make or break a loader, and stale segment cleanup."""

from __future__ import annotations

import importlib.metadata as md
import os

from ..decode import decoder_name, jpegcrop
from ..loader import config
from ..shm.folder import SHM_DIR, shm_free_bytes
from ..shm.stale import clean_stale, stale_segments
from ..sources import filereads


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "not installed"


def doctor(clean: bool = False) -> str:
    """A readable report; with ``clean``, remove segments left by dead processes."""
    free = shm_free_bytes()
    try:
        st = os.statvfs(SHM_DIR)
        total = st.f_blocks * st.f_frsize
    except OSError:
        total = 0
    stale = stale_segments()
    lines = [
        f"/dev/shm: {total / 2**20:,.0f} MiB, {free / 2**20:,.0f} MiB free"
        + ("  (small: stoker will fall back to file-backed memory)" if total < 256 << 20 else ""),
        f"stale stoker segments (owner provably gone: its lock is free): {len(stale)}",
        *[f"  {p}" for p in stale[:20]],
        f"usable CPU cores: {config.usable_cpus()}; workers start as fresh interpreters "
        "from stoker's own entry point, never re-running your script, importing from your "
        "sys.path only (never the current folder)",
        f"decoders: simplejpeg {_version('simplejpeg')}, "
        f"opencv {_version('opencv-python-headless')}, pillow {_version('pillow')}",
        f"JPEG decoder in use: {decoder_name()}",
        *([] if jpegcrop.AVAILABLE else [f"  {jpegcrop.missing_message()}"]),
        f"file reads ahead of decoding: {filereads.describe()}",
        "frameworks: "
        + ", ".join(f"{p} {_version(p)}" for p in ("keras", "tensorflow-cpu", "torch", "jax")),
    ]
    if clean:
        removed = clean_stale()
        lines.append(f"removed {len(removed)} stale segment(s)")
    return "\n".join(lines)
