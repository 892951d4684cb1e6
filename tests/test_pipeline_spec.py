"""The frozen PipelineSpec: every field either changes what in-memory arrays come out as, or is
declared pixel-neutral; and the bulk copy of an array batch is taken exactly when the spec says
the pixels are unchanged (so a new pixel option cannot be skipped for arrays)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import stoker
from stoker.assemble import Assembler, Report
from stoker.decode.masks import MaskMap
from stoker.order import Plan, sample_uniforms
from stoker.sources import open_source
from stoker.transforms import PipelineSpec, pipeline_spec

N, H, W = 6, 12, 16


def _invert(image, rng):
    """A user op that changes every pixel."""
    return 255 - image


#: A non-default value of every field, from the base spec (a plain copy of the arrays): a field
#: added to PipelineSpec fails ``test_every_field_...`` until it is listed here.
CHANGED = {
    "kind": {"kind": "train"},
    "size": {"size": (H // 2, W // 2)},
    "channels": {"channels": 1},
    "interpolation": {"interpolation": "nearest"},
    "fit": {"fit": "crop"},
    "fast": {"fast": True},
    "max_pixels": {"max_pixels": 1},
    "strict_decode": {"strict_decode": True},
    "mask_map": {"mask_map": MaskMap({1: 0})},
    "ops": {"kind": "custom", "ops": (_invert,)},
    "post": {"post": (_invert,)},
}


def _images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (N, H, W, 3), dtype=np.uint8)


def _filled(spec: PipelineSpec, images: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """The first batch (all ``N`` arrays) through the assembler, the same samples through its
    per-sample path (``load_one``), and whether the batch was copied whole."""
    source = open_source(images)
    assembler = Assembler(source, spec, Plan(N, N, 0, False, False))
    shape = (N, *spec.size, spec.channels)
    arrays = {"image": np.zeros(shape, np.uint8), "index": np.zeros(N, np.int64)}
    arrays["label"] = np.zeros(N, source.labels.dtype)
    assembler.fill(0, 0, arrays)
    one = np.zeros(shape, np.uint8)
    u = sample_uniforms(0, 0, np.arange(N), assembler.pipeline.uniforms)  # as fill draws them
    for k in range(N):
        assert assembler.load_one(0, k, (one[k], None), u[k], Report())
    return arrays["image"], one, assembler.copies_whole


def test_every_field_changes_array_output_or_is_declared_pixel_neutral() -> None:
    names = {f.name for f in dataclasses.fields(PipelineSpec)}
    assert set(CHANGED) == names, "a PipelineSpec field is not covered here: list it in CHANGED"
    assert PipelineSpec.PIXEL_NEUTRAL <= names
    images = _images()
    base = PipelineSpec(size=(H, W), channels=3)
    assert base.keeps_pixels((H, W), 3)
    batch, one, whole = _filled(base, images)
    assert whole and np.array_equal(batch, images) and np.array_equal(one, images)
    for name, change in CHANGED.items():
        spec = dataclasses.replace(base, **change)
        batch, one, whole = _filled(spec, images)
        assert whole == spec.keeps_pixels((H, W), 3), name  # the bulk copy: the spec says so
        if name in PipelineSpec.PIXEL_NEUTRAL:
            assert whole, f"{name} is declared pixel-neutral: the batch is copied whole"
            assert np.array_equal(one, images), f"{name} is declared neutral and changes pixels"
        else:
            assert not whole, f"{name} changes pixels: the batch is not copied whole"
            same = one.shape == images.shape and np.array_equal(one, images)
            assert not same, f"{name}={change[name]!r} leaves arrays unchanged: declare it neutral"
        assert np.array_equal(batch, one), f"{name}: batch and per-sample path differ"


def test_a_stock_pipeline_with_ops_after_it_is_never_skipped_for_arrays() -> None:
    images = _images()
    with stoker.Loader(images, augment=["resize", _invert], batch_size=N, shuffle=False) as ld:
        assert not ld.recipe.pipeline.keeps_pixels((H, W), 3)
        got = next(iter(ld))[0]
    np.testing.assert_array_equal(got, 255 - images)


def test_the_recipe_holds_a_frozen_spec_and_each_process_builds_its_own_pipeline() -> None:
    with stoker.Loader(_images(), image_size=8, batch_size=2, workers=0) as loader:
        spec = loader.recipe.pipeline
        assert isinstance(spec, PipelineSpec) and spec.size == (8, 8)
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.channels = 1  # type: ignore[misc]
        live = spec.build()  # what the loader's own filler does in this process
        assert live.spec is spec
        again = pickle.loads(pickle.dumps(spec)).build()  # what a worker does with it
        assert again is not live and again.spec == spec


@pytest.mark.parametrize(
    ("augment", "kind", "ops", "post"),
    [
        ("train", "train", (), ()),
        (None, "resize", (), ()),
        (_invert, "custom", (_invert,), ()),
        (["eval", _invert], "eval", (), (_invert,)),
    ],
)
def test_augment_names_the_kind_and_its_ops(augment, kind, ops, post) -> None:
    spec = pipeline_spec(augment, (8, 8))
    assert (spec.kind, spec.ops, spec.post) == (kind, ops, post)
    assert spec.build().needs_rng == bool(ops or post)
