"""The RunSpec: how a loader's batches are made, resolved once from the ``run`` and ``ray``
option groups, frozen, read through the Loader, and handed whole to the pool and the nodes."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import stoker
from stoker.loader.options import RunOptions
from stoker.workers.runspec import RunSpec

#: The fields the loader resolves itself; every other field is copied from the run group.
RESOLVED = {"workers", "workers_reason", "auto_workers", "cluster"}


def test_the_loader_resolves_one_frozen_run_spec():
    images = np.zeros((8, 8, 8, 3), np.uint8)
    kw = dict(image_size=8, batch_size=4, worker_threads=None, prefetch=3, timeout=60)
    with stoker.Loader(images, labels=np.arange(8), workers=2, **kw) as loader:
        assert loader.run == RunSpec(
            workers=2,
            workers_reason="set by you",
            auto_workers=False,
            prefetch=3,
            timeout=60.0,
            worker_threads=None,
            cluster=None,
        )
        assert loader.run.workers == 2
        with pytest.raises(dataclasses.FrozenInstanceError):
            loader.run.timeout = 1.0  # type: ignore[misc]
        with pytest.raises(AttributeError):
            loader.run = dataclasses.replace(loader.run, workers=1)  # type: ignore[misc]


def test_workers_auto_is_settled_into_a_new_spec_once():
    spec = RunSpec(workers=4, workers_reason="auto: 4 cores", auto_workers=True, timeout=9.0)
    settled = spec.settled(2, "auto: measured")
    assert (settled.workers, settled.workers_reason, settled.auto_workers) == (
        2,
        "auto: measured",
        False,
    )
    assert settled.timeout == 9.0 and spec.workers == 4  # the rest kept; the old spec unchanged


def test_every_field_not_resolved_is_copied_from_the_run_group_by_name():
    copied = {f.name for f in dataclasses.fields(RunSpec)} - RESOLVED
    assert copied <= {f.name for f in dataclasses.fields(RunOptions)}
    group = SimpleNamespace(prefetch=2, timeout=5.0, worker_threads=3, workers="auto", page_cache=0)
    spec = RunSpec.of(group, workers=1, workers_reason="set by you")
    assert (spec.prefetch, spec.timeout, spec.worker_threads) == (2, 5.0, 3)
    assert (spec.workers, spec.workers_reason) == (1, "set by you")
