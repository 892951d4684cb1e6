"""Where segments go: ``/dev/shm`` when it has room, else the temporary folder.

A folder is picked for what is about to be made with room to grow and a margin left for other
programs; when neither folder has the room, the one where the segments fit at all, so a failure
names that folder and its fix (:func:`room_fix`).
"""

from __future__ import annotations

import os
import tempfile

from ..errors import warn

SHM_DIR = "/dev/shm"


def segment_dirs() -> list[str]:
    """Folders where stoker may place segments: ``/dev/shm`` first, then the temp folder."""
    dirs = [SHM_DIR] if os.path.isdir(SHM_DIR) else []
    return dirs + [tempfile.gettempdir()]


def shm_free_bytes() -> int:
    """Free bytes in ``/dev/shm`` (0 when it does not exist)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


#: Room a folder keeps for others when stoker picks it (the shared memory of other programs,
#: segments stoker makes later): the smaller of this and ``MARGIN_SHARE`` of its size.
MARGIN_BYTES = 64 << 20
MARGIN_SHARE = 1 / 8
GROWTH = 1.25  # room asked beyond the segments made now: deepening, slots of kept batches


def folder_room(folder: str) -> tuple[int, int]:
    """``(free bytes, total bytes)`` of the file system holding ``folder`` (0, 0 if none)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0, 0
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def margin(total: int) -> int:
    """The room left for others in a file system of ``total`` bytes."""
    return int(min(MARGIN_BYTES, total * MARGIN_SHARE))


def pick_folder(total_bytes: int, what: str = "the batch ring") -> str:
    """``/dev/shm`` when it has room for ``total_bytes`` (with growth and a margin), else the
    temp folder when that has the room (with a warning naming ``what`` needs it); when neither
    has, the one where ``total_bytes`` fits at all (``/dev/shm`` first), else the one with more
    free room: a failure there then names that folder and its fix."""
    tmp = tempfile.gettempdir()
    if not os.path.isdir(tmp):
        return SHM_DIR
    want = int(total_bytes * GROWTH)
    (shm_free, shm_total), (tmp_free, tmp_total) = folder_room(SHM_DIR), folder_room(tmp)
    if shm_free >= want + margin(shm_total):
        return SHM_DIR
    if tmp_free >= want + margin(tmp_total):
        _warn_file_backed(what, want, shm_free, margin(shm_total), tmp, tmp_free)
        return tmp
    if shm_free >= total_bytes or shm_free >= tmp_free:
        return SHM_DIR
    _warn_file_backed(what, want, shm_free, margin(shm_total), tmp, tmp_free)
    return tmp


def _warn_file_backed(what: str, want: int, free: int, kept: int, tmp: str, tmp_free: int) -> None:
    warn(
        f"/dev/shm has {human_size(free)} free but {what} needs {human_size(want)} "
        f"(with room to grow) and {human_size(kept)} is left for other programs; using "
        f"file-backed memory in {tmp} ({human_size(tmp_free)} free) instead (slower to start). "
        "Enlarge /dev/shm (docker run --shm-size=2g) to avoid this."
    )


def room_fix(folder: str) -> str:
    """How to make room for the batch ring in ``folder``: a smaller ring, or a bigger folder
    (Docker's ``--shm-size`` only for ``/dev/shm``, which it sizes)."""
    if folder == SHM_DIR:
        return (
            "lower batch_size or prefetch, or enlarge /dev/shm (docker run --shm-size=2g; "
            "on a host: mount -o remount,size=8g /dev/shm)"
        )
    return (
        f"lower batch_size or prefetch, free space in {folder}, or point TMPDIR at a folder "
        "with room (file-backed memory is used there because /dev/shm is too small)"
    )


def human_size(nbytes: int) -> str:
    """``nbytes`` as MiB or KiB, for messages."""
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"
