"""Cache files no other user can plant, swap, point elsewhere or read.

Every cache stoker keeps (folder scans, tar scans, Parquet and remote byte-offset indexes) is
written and read through this module, on these rules:

- a cache folder is this user's, not writable by group or others, and so is every folder above
  it, unless that one is sticky (``/tmp``) or root's; stoker creates its folders with mode 0700
  and refuses (with a warning naming the folder and the fix) one that breaks a rule;
- a cache file is written under a random temporary name created exclusively, never following
  a link (``O_CREAT | O_EXCL | O_NOFOLLOW``), mode 0600, then renamed over the cache's name:
  a link planted at either name is replaced, never written through;
- a cache file is read only when it is a regular file of this user's (or, for a Parquet
  shard's sidecar index, of the shard's owner) that no group or other user can write; anything
  else is ignored with a warning naming the file and why, and the cache is rebuilt.

A folder scan and its arrays are one file (``save_arrays``: an ``.npz``, its members checked
by their CRC on load, the metadata stored as JSON inside), so it is replaced as a whole.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import warn

PRIVATE = 0o700  # folders stoker creates
FILE_MODE = 0o600  # cache files
_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
_warned: set[str] = set()


def warn_once(text: str) -> None:
    """One warning per distinct message per process (a planted file is named once, not per
    Loader)."""
    if text not in _warned:
        _warned.add(text)
        warn(text)


# ---------------------------------------------------------------------------- folders


def folder_problem(folder: str | os.PathLike, owners: tuple[int, ...] = ()) -> str | None:
    """Why ``folder`` cannot hold files that only this user (or ``owners``) could have written,
    or None when it can: it and every folder above it (links resolved) must be owned by this
    user, one of ``owners`` or root, and a folder writable by group or others must be sticky
    (there, no one can rename or remove another user's file). The folder itself must not be a
    link and, unless ``owners`` are given, must be this user's and writable by no one else."""
    me = os.geteuid()
    path = os.path.abspath(folder)
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if not owners and (st.st_uid != me or st.st_mode & _SHARED_WRITE):
        return _bad_owner(st) or f"is writable by group or others (mode {st.st_mode & 0o7777:o})"
    allowed = {me, 0, *owners}
    current = os.path.realpath(path)
    while True:
        try:
            st = os.stat(current)
        except OSError as exc:
            return f"cannot be checked ({current}: {exc.strerror})"
        if st.st_uid not in allowed:
            return f"lies in {current}, owned by uid {st.st_uid} (not you, uid {me}, nor root)"
        if st.st_mode & _SHARED_WRITE and not st.st_mode & stat.S_ISVTX:
            return (
                f"lies in {current}, which group or others can write (mode "
                f"{st.st_mode & 0o7777:o}, not sticky): a file there can be swapped"
            )
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _bad_owner(st: os.stat_result) -> str | None:
    me = os.geteuid()
    return None if st.st_uid == me else f"is owned by uid {st.st_uid}, not you (uid {me})"


def private_folder(folder: str | os.PathLike, create: bool) -> Path | None:
    """``folder`` (links above it resolved) when it is safe for cache files (see
    :func:`folder_problem`), created with mode 0700 (and its missing parents) when ``create``;
    None when it does not exist and ``create`` is False, or when it is unsafe (with a warning
    naming it and the fix). Use the returned path, never ``folder`` again: a link above it that
    changes later cannot redirect the files."""
    path = Path(os.path.abspath(folder))
    if not os.path.lexists(path):
        if not create:
            return None
        try:
            _make_private(path)
        except OSError:
            return None  # a read-only home: no cache
    if not os.path.islink(path) and not os.path.isdir(path):
        return None  # a file in the way: no cache, as with a read-only home
    problem = folder_problem(path)
    if problem is not None:
        warn_once(
            f"stoker cache folder {path} {problem}: another user could plant or read the cache "
            "there, so it is not used (the data is read without a cache). Pass cache_dir= a "
            "folder of your own (mode 0700), or fix its owner and mode"
        )
        return None
    return Path(os.path.realpath(path))


def _make_private(path: Path) -> None:
    """Create ``path`` and its missing parents, each with mode 0700 whatever the umask."""
    if os.path.lexists(path):
        return
    _make_private(path.parent)
    try:
        os.mkdir(path, PRIVATE)
    except FileExistsError:
        return  # made meanwhile (by another process): checked as any existing folder
    os.chmod(path, PRIVATE)


# ---------------------------------------------------------------------------- writing


def write_atomic(
    path: str | os.PathLike, fill: Callable[[IO[bytes]], object], mode: int = FILE_MODE
) -> None:
    """Create ``path``'s content by ``fill(file)`` under a random name beside it (created
    exclusively, not through a link, with ``mode``), then rename it over ``path`` (a link at
    ``path`` is replaced, not followed). OSError on failure, with no file left behind."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # the umask does not widen or narrow it
            fill(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_cache(path: Path, fill: Callable[[IO[bytes]], object]) -> Path | None:
    """Write a cache file in a private folder (created if missing); the path written (links
    above it resolved), or None when it could not be written (no safe folder, a read-only
    home): the caller goes on without a cache."""
    folder = private_folder(path.parent, create=True)
    if folder is None:
        return None
    try:
        write_atomic(folder / path.name, fill)
    except OSError:
        return None
    return folder / path.name


# ---------------------------------------------------------------------------- reading


def open_trusted(path: str | os.PathLike, owners: tuple[int, ...] = ()) -> IO[bytes] | None:
    """``path`` open for reading if it is a regular file owned by this user (or one of
    ``owners``) that no group or other user can write; None when it does not exist, or (with
    a warning naming it and why) when it is not to be trusted."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _distrust(
            path,
            "is a symbolic link" if os.path.islink(path) else f"cannot be opened ({exc.strerror})",
        )
        return None
    st = os.fstat(fd)
    why: str | None = None
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_uid not in (os.geteuid(), *owners):
        why = f"is owned by uid {st.st_uid}, not you (uid {os.geteuid()})"
    elif st.st_mode & _SHARED_WRITE:
        why = f"is writable by group or others (mode {st.st_mode & 0o7777:o})"
    if why is not None:
        os.close(fd)
        _distrust(path, why)
        return None
    return os.fdopen(fd, "rb")


def _distrust(path: str, why: str) -> None:
    warn_once(
        f"stoker ignored {path}: it {why}, so another user could have written it; "
        "it is rebuilt from the data (in your own cache)"
    )


def read_cache(path: Path) -> bytes | None:
    """The bytes of a cache file in a private folder; None when missing or not to be trusted."""
    folder = private_folder(path.parent, create=False)
    if folder is None:
        return None
    f = open_trusted(folder / path.name)
    if f is None:
        return None
    with f:
        return f.read()


# ---------------------------------------------------------------------------- arrays + metadata


def save_arrays(path: Path, meta: dict[str, Any], arrays: dict[str, Any]) -> bool:
    """Store ``meta`` (JSON) and ``arrays`` as one ``.npz`` cache file (never pickle)."""
    members: dict[str, Any] = {**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    return write_cache(path, lambda f: np.savez(f, **members)) is not None


def load_arrays(
    path: Path, names: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """``(meta, arrays)`` from a file :func:`save_arrays` wrote; None when it is missing, not
    to be trusted, damaged (a member's CRC differs) or lacks one of ``names``."""
    data = read_cache(path)
    if data is None:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            meta = json.loads(npz["meta"].tobytes())
            arrays = {n: npz[n] for n in names}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return None
    return (meta, arrays) if isinstance(meta, dict) else None
