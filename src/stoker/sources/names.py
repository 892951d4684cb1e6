"""File and folder names as stoker's Parquet shards store them: any name, losslessly, as text.

A POSIX name is bytes (anything but ``/`` and NUL); Python holds one that is not UTF-8 with
surrogate escapes (``'caf\\udce9'``), which no UTF-8 string can carry. Parquet strings must be
valid UTF-8, so ``stoker convert`` stores every name (the ``image.path`` column, the class
names of the manifest and of the Hugging Face metadata) in one reversible form, *bytes-escaped*:

- the name's bytes on disk (``os.fsencode``), read as UTF-8 where they are UTF-8;
- each byte that is not part of valid UTF-8 written as ``\\xNN`` (two lowercase hex digits);
- each backslash written twice (``\\\\``), so a name that holds ``\\x41`` itself stays apart.

Every other character, newlines and tabs included, is stored as it is. A name that is valid
UTF-8 with no backslash (nearly every name) is stored unchanged, so other readers of the
shards see the names they expect. A shard in this form says so in its schema metadata
(:data:`KEY` = :data:`FORM`) and the manifest in ``"names"``; :class:`ShardSource` turns the
names back (:func:`from_text`) only then, so the names of other Parquet files are read as they
are.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["FORM", "KEY", "to_text", "from_text", "escaped"]

FORM = "bytes-escaped"
KEY = b"stoker.names"  # the shard schema metadata key whose value is FORM
_ESCAPE = re.compile(rb"\\(\\|x([0-9a-f]{2}))")


def to_text(name: str) -> str:
    """``name`` (a str as ``os.listdir`` gives it, surrogate escapes and all) in the
    bytes-escaped form: valid UTF-8 text that :func:`from_text` turns back into ``name``."""
    raw = os.fsencode(name).replace(b"\\", b"\\\\")
    return raw.decode("utf-8", "backslashreplace")


def from_text(text: str) -> str:
    """The name that :func:`to_text` stored as ``text``."""

    def byte(match: re.Match[bytes]) -> bytes:
        hexa = match[2]
        return b"\\" if hexa is None else bytes([int(hexa, 16)])

    return os.fsdecode(_ESCAPE.sub(byte, text.encode("utf-8")))


def escaped(metadata: dict[bytes, bytes] | None) -> bool:
    """Whether a shard whose schema metadata is ``metadata`` stores its names bytes-escaped."""
    return (metadata or {}).get(KEY) == FORM.encode()


def names_back(names: Any, form: bool) -> Any:
    """``names`` (a list of stored names) turned back when ``form`` says they are escaped."""
    if not form or not isinstance(names, list):
        return names
    return [from_text(str(n)) for n in names]
