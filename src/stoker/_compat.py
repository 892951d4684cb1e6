"""What stoker needs from Python 3.11 that 3.10 lacks, in one place (3.10 is supported).

Each helper calls the standard library where it has the function and does the same work
itself where it does not; nothing here changes behaviour on 3.11 and later.
"""

from __future__ import annotations

import hashlib
import io

CHUNK = 1 << 20


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``. On 3.10 the note goes into ``__notes__`` as 3.11 keeps it, and,
    since 3.10's traceback never prints ``__notes__``, onto a plain-text message too, so the
    user still reads which sample and file raised."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    if len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{note}",)


def file_sha256(f: io.BufferedReader) -> str:
    """The hex sha256 of an open binary file, read from its position to its end."""
    if hasattr(hashlib, "file_digest"):
        return hashlib.file_digest(f, "sha256").hexdigest()
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(CHUNK), b""):
        digest.update(block)
    return digest.hexdigest()
