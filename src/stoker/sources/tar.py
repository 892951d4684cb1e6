"""WebDataset tar shards: samples are groups of members sharing a key (the path up to the first
dot of the file name), e.g. ``n01/img_7.jpg`` + ``n01/img_7.cls``.

The tars are indexed once with :mod:`tarfile` (headers only; label members are small and read
then); ``read(i)`` is then one ``pread`` at the image's offset. Nothing is ever extracted to
disk. Members whose names are absolute or contain ``..`` are refused (counted in ``refused``
and warned about), and serialised-object members (``.pyd``, ``.pickle``...) are ignored: stoker
never unpickles data. Only uncompressed ``.tar`` files are accepted (a compressed tar cannot be
read at an offset).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SourceError
from .base import PathIndex, Source, drop_pages
from .targets import parse_column

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
LABEL_KEYS = ("cls", "label", "txt")
_MAX_LABEL_BYTES = 4096


def unsafe_member_name(name: str) -> bool:
    """True for a member path that could escape a folder: absolute, drive-qualified or ``..``."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return True
    return any(part == ".." for part in name.replace("\\", "/").split("/"))


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: ``dir/base.ext.more`` -> (``dir/base``, ``ext.more``), lowercased ext."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


class TarSource(Source):
    """WebDataset-style ``.tar`` shards (a folder of them, one file, or a list)."""

    read_ahead = True

    def __init__(self, tars: str | os.PathLike | list[str | os.PathLike]) -> None:
        self.tars = _list_tars(tars)
        members: list[str] = []
        tar_ids: list[int] = []
        offsets: list[int] = []
        sizes: list[int] = []
        raw_labels: list[Any] = []
        self.refused: list[str] = []
        for t, path in enumerate(self.tars):
            for _key, image, label in self._scan(path):
                members.append(image.name)
                tar_ids.append(t)
                offsets.append(image.offset_data)
                sizes.append(image.size)
                raw_labels.append(label)
        if not members:
            raise SourceError(
                f"{tars}: no samples with a {'/'.join(IMAGE_KEYS)} member in the tar file(s)"
            )
        if self.refused:
            warnings.warn(
                f"stoker refused {len(self.refused)} tar member(s) with unsafe names (absolute or "
                f"containing '..'), first {self.refused[0]!r}; they are not part of the dataset",
                UserWarning,
                stacklevel=2,
            )
        self.index = PathIndex(Path(""), members)
        self.tar_ids = np.asarray(tar_ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        if all(v is None for v in raw_labels):
            self.labels, self.classes = np.full(len(members), -1, dtype=np.int64), None
        else:
            cells = ["" if v is None else v.strip() for v in raw_labels]
            self.labels, self.classes = parse_column(cells, f"{tars}: labels")
        self._fds: dict[int, int] = {}

    def _scan(self, path: str) -> list[tuple[str, tarfile.TarInfo, str | None]]:
        """(key, image member, label text) of each sample in one tar, in archive order."""
        groups: dict[str, dict[str, tarfile.TarInfo]] = {}
        try:
            with tarfile.open(path, mode="r:") as tar:
                for member in tar:
                    if not member.isfile() or member.issparse():
                        continue
                    if unsafe_member_name(member.name):
                        self.refused.append(f"{path}:{member.name}")
                        continue
                    key, ext = split_key(member.name)
                    groups.setdefault(key, {})[ext] = member
                samples = []
                for key, parts in groups.items():
                    image = next((parts[e] for e in IMAGE_KEYS if e in parts), None)
                    if image is None:
                        continue
                    label_member = next((parts[e] for e in LABEL_KEYS if e in parts), None)
                    label = None
                    if label_member is not None and label_member.size <= _MAX_LABEL_BYTES:
                        f = tar.extractfile(label_member)  # a file object; never written out
                        if f is not None:
                            label = f.read().decode("utf-8", "replace").strip() or None
                    samples.append((key, image, label))
        except (tarfile.TarError, OSError) as exc:
            raise SourceError(
                f"{path}: cannot read as an uncompressed tar ({exc}); WebDataset shards must be "
                "plain .tar files"
            ) from None
        return samples

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fds": {}}

    def read(self, index: int) -> bytes:
        """The image member's bytes: one positioned read."""
        size = int(self.sizes[index])
        data = os.pread(self._fd(index), size, int(self.offsets[index]))
        if len(data) != size:
            raise OSError(f"{self.name(index)}: short read ({len(data)} of {size} bytes)")
        return data

    def forget(self, index: int) -> bool:
        """Drop the member's byte range of its tar from the page cache."""
        size, offset = int(self.sizes[index]), int(self.offsets[index])
        drop_pages("", offset, size, fd=self._fd(index))
        return True

    def _fd(self, index: int) -> int:
        """This process's descriptor of sample ``index``'s tar (safe from several threads)."""
        t = int(self.tar_ids[index])
        fd = self._fds.get(t)
        if fd is None:
            fd = os.open(self.tars[t], os.O_RDONLY)
            kept = self._fds.setdefault(t, fd)
            if kept != fd:  # another thread opened it first
                os.close(fd)
                fd = kept
        return fd

    def name(self, index: int) -> str:
        """``shard.tar:member/name.jpg``."""
        return f"{self.tars[int(self.tar_ids[index])]}:{self.index.relative(index)}"

    def fingerprint(self) -> str:
        """Digest of tar names and sizes, member names, and labels."""
        h = hashlib.blake2b(self.index.digest().encode(), digest_size=12)
        for path in self.tars:
            h.update(f"{os.path.basename(path)}|{os.path.getsize(path)}\0".encode())
        h.update(self.labels.tobytes())
        return h.hexdigest()

    def close(self) -> None:
        """Close this process's file descriptors."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def _list_tars(spec: Any) -> list[str]:
    if isinstance(spec, (list, tuple)):
        tars = [os.fspath(p) for p in spec]
    else:
        path = Path(spec)
        if path.is_dir():
            tars = sorted(str(p) for p in path.glob("*.tar") if p.is_file())
        elif path.is_file():
            tars = [str(path)]
        else:
            raise SourceError(f"{path}: no such folder or tar file")
    if not tars:
        raise SourceError(f"{spec}: no .tar files")
    return tars
