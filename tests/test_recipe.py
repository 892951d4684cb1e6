"""The Recipe: what a loader is made of, built once, read-only through the Loader, and sent
whole to the workers and to a cluster node (which fills the same bytes from it)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import stoker
from stoker.recipe import Recipe
from stoker.shm.segments import by_value
from stoker.workers.launch import pack
from stoker.workers.pool import WorkerSpec


def test_the_loader_is_made_of_one_frozen_recipe_it_reads_through(image_folder):
    with stoker.Loader(image_folder, image_size=32, batch_size=4, workers=0) as loader:
        recipe = loader.recipe
        assert isinstance(recipe, Recipe)
        assert loader.recipe is recipe  # read through, never copied onto the loader
        mirrors = ("pipeline", "schema", "reads", "slot_layout", "columns", "form", "workers")
        assert not [name for name in mirrors if hasattr(loader, name)]
        assert loader.class_names is recipe.source.classes
        with pytest.raises(dataclasses.FrozenInstanceError):
            recipe.plan = None  # type: ignore[misc]
        with pytest.raises(AttributeError):
            loader.recipe = recipe  # type: ignore[misc]
        # what each worker process is given: the Recipe, the RunSpec, its status segment and
        # the count of its pool's workers
        names = [f.name for f in dataclasses.fields(WorkerSpec)]
        assert names == ["recipe", "run", "status", "workers"]


@pytest.mark.timeout(120)
def test_a_node_receives_the_loaders_recipe_by_value_and_fills_the_same_bytes(image_folder):
    meta = np.random.default_rng(0).normal(size=(36, 8192))  # > 1 MiB: a shared segment
    opts = dict(fields={"meta": meta}, batch="dict", image_size=32, batch_size=4, seed=3)
    with stoker.Loader(image_folder, workers=0, **opts) as loader:
        with by_value():  # as the trainer packs it for the nodes (workers.nodes)
            blob = pack(loader.recipe, {"source": loader.recipe.source})
        received = pickle.loads(blob)  # what the node's actor does with it
        try:
            assert isinstance(received, Recipe)
            assert received.plan == loader.recipe.plan
            assert received.schema.slot_layout == loader.recipe.schema.slot_layout
            assert received.schema.form == loader.recipe.schema.form
            # a copy in a segment of its own, not a handle to the trainer's
            ours, its = loader.recipe.schema.columns._shared, received.schema.columns._shared
            assert ours is not None and its is not None
            assert its.segment.path != ours.segment.path and its.segment.owner
            mine, theirs = (
                loader.recipe.schema.slot_layout.arrays(),
                received.schema.slot_layout.arrays(),
            )
            loader.recipe.assembler().fill(0, 1, mine)
            received.assembler().fill(0, 1, theirs)
            assert mine.keys() == theirs.keys()
            for name in mine:
                np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
        finally:
            received.close()  # the node's copies of the shared arrays
