"""A lock file is announced to the reaper before it exists, as a segment is: a trainer killed
between creating its lock file and telling the reaper (a chaos trial caught one, SIGTERM at
start-up) would otherwise leave the file in /dev/shm for good."""

from __future__ import annotations

import os

from stoker.shm import ownerlock, reaper


def test_the_reaper_knows_a_lock_file_before_it_is_created(tmp_path, monkeypatch):
    folder = tmp_path / "shm"
    folder.mkdir()
    segment = str(folder / f"stoker_{ownerlock.tag()}_1_test")
    lock = ownerlock.lock_path(str(folder), ownerlock.tag())
    known_at_create = []
    real_open = os.open

    def watching_open(path, flags, *args):
        if path == lock and flags & os.O_CREAT:
            known_at_create.append(lock in reaper._client.paths)
        return real_open(path, flags, *args)

    monkeypatch.setattr(ownerlock.os, "open", watching_open)
    ownerlock.adding(segment)
    try:
        assert known_at_create == [True]
        assert os.path.exists(lock)
    finally:
        ownerlock.removed(segment)
    assert not os.path.exists(lock) and lock not in reaper._client.paths
