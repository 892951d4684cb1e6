"""The habits of ported training scripts: a batch-level transform run in the workers (mixup,
cutmix, on masks too), ``peek()`` that never moves the position, the DataLoader attributes
training loops read (``.dataset``, ``.sampler``, ``.batch_size``) and per-half options with
``subset="both"``. Real JPEGs, real worker processes."""

from __future__ import annotations

import numpy as np
import pytest

import stoker
from stoker.batchfn import batch_rng
from stoker.errors import ConfigError

CLASSES = 3


def mixup(batch, rng):
    """torchvision's RandomMixUp on a uint8 batch: one lambda per batch, the batch rolled by
    one, labels made soft (float32, one column per class)."""
    lam = float(rng.beta(1.0, 1.0))
    image = batch["image"].astype(np.float32)
    batch["image"][...] = np.rint(lam * image + (1 - lam) * np.roll(image, 1, axis=0))
    target = np.eye(CLASSES, dtype=np.float32)[batch["label"]]
    return {"label": lam * target + (1 - lam) * np.roll(target, 1, axis=0)}


def cutmix_box(h, w, rng):
    """torchvision's RandomCutMix box: a random centre, area ``1 - lam``."""
    lam = float(rng.beta(1.0, 1.0))
    cy, cx = int(rng.integers(h)), int(rng.integers(w))
    rh, rw = int(h * np.sqrt(1 - lam) / 2), int(w * np.sqrt(1 - lam) / 2)
    return max(cy - rh, 0), min(cy + rh, h), max(cx - rw, 0), min(cx + rw, w)


def cutmix(batch, rng):
    """RandomCutMix: paste a box of the rolled batch; labels weighted by the pasted area."""
    images = batch["image"]
    h, w = images.shape[1:3]
    y0, y1, x0, x1 = cutmix_box(h, w, rng)
    images[:, y0:y1, x0:x1] = np.roll(images, 1, axis=0)[:, y0:y1, x0:x1]
    lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    target = np.eye(CLASSES, dtype=np.float32)[batch["label"]]
    return {"label": (lam * target + (1 - lam) * np.roll(target, 1, axis=0)).astype(np.float32)}


def cutmix_masks(batch, rng):
    """CutMix for segmentation: the mask region is pasted with the image region."""
    images, masks = batch["image"], batch["mask"]
    y0, y1, x0, x1 = cutmix_box(*images.shape[1:3], rng)
    images[:, y0:y1, x0:x1] = np.roll(images, 1, axis=0)[:, y0:y1, x0:x1]
    masks[:, y0:y1, x0:x1] = np.roll(masks, 1, axis=0)[:, y0:y1, x0:x1]


def _epoch(loader):
    return [tuple(np.array(v) for v in batch) for batch in loader]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)


KW = dict(batch_size=8, image_size=32, seed=3)
# a quarter held out, both halves made at once, small and inline
HALVES = dict(validation_split=0.25, subset="both", batch_size=4, image_size=16, workers=0)


@pytest.mark.timeout(300)
def test_mixup_in_the_workers_gives_soft_labels_bit_identical_across_workers_and_resume(
    image_folder,
):
    plain = stoker.Loader(image_folder, workers=0, **KW)
    before = _epoch(plain)
    plain.close()
    inline = stoker.Loader(image_folder, workers=0, batch_transform=mixup, **KW)
    ref = _epoch(inline)
    inline.close()
    x, y = ref[0]
    assert y.dtype == np.float32 and y.shape == (8, CLASSES)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    assert not np.array_equal(x, before[0][0])  # the images were mixed, in the workers' slot
    # the labels are the mix of the batch's own labels and the rolled batch's
    hard = np.eye(CLASSES, dtype=np.float32)[before[0][1]]
    lam = y[0] @ hard[0] if before[0][1][0] != before[0][1][-1] else None
    if lam is not None:
        np.testing.assert_allclose(y, lam * hard + (1 - lam) * np.roll(hard, 1, axis=0), atol=1e-6)
    with stoker.Loader(image_folder, workers=2, batch_transform=mixup, **KW) as pooled:
        _same(ref, _epoch(pooled))
        state = pooled.state_dict()
        next(iter(pooled))
        resumed_at = pooled.state_dict()
    with stoker.Loader(image_folder, workers=2, batch_transform=mixup, **KW) as again:
        again.load_state_dict(resumed_at)
        assert state["epoch"] == 1
        _same(_epoch(again), _epoch_of(image_folder, 1)[1:])


def _epoch_of(folder, epoch):
    with stoker.Loader(folder, workers=0, batch_transform=mixup, **KW) as loader:
        loader.set_epoch(epoch)
        return _epoch(loader)


@pytest.mark.timeout(300)
def test_cutmix_pastes_the_box_its_documented_generator_draws(image_folder):
    with stoker.Loader(image_folder, workers=0, augment="eval", **KW) as loader:
        x0, y0 = (np.array(v) for v in next(iter(loader)))
    with stoker.Loader(
        image_folder, workers=2, augment="eval", batch_transform=cutmix, **KW
    ) as mixed:
        x, y = (np.array(v) for v in next(iter(mixed)))
    # replay: global step 0 of epoch 0 draws from batch_rng(seed, 0, 0)
    y_0, y_1, x_0, x_1 = cutmix_box(32, 32, batch_rng(KW["seed"], 0, 0))
    assert y_1 > y_0 and x_1 > x_0
    want = x0.copy()
    want[:, y_0:y_1, x_0:x_1] = np.roll(x0, 1, axis=0)[:, y_0:y_1, x_0:x_1]
    np.testing.assert_array_equal(x, want)
    lam = 1.0 - (y_1 - y_0) * (x_1 - x_0) / 32**2
    hard = np.eye(CLASSES, dtype=np.float32)[y0]
    np.testing.assert_allclose(y, lam * hard + (1 - lam) * np.roll(hard, 1, axis=0), atol=1e-6)


def test_batch_transform_draws_differ_per_batch_and_epoch_and_follow_the_seed(image_folder):
    draws = []

    def record(batch, rng):
        return {"draw": np.full(len(batch["image"]), rng.random(), np.float64)}

    with stoker.Loader(
        image_folder, workers=0, batch_transform=record, batch="dict", augment=None, **KW
    ) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            draws.append([float(b["draw"][0]) for b in loader])
    assert len(set(draws[0] + draws[1])) == len(draws[0]) * 2
    with stoker.Loader(
        image_folder, workers=0, batch_transform=record, batch="dict", augment=None, **KW
    ) as loader:
        assert [float(b["draw"][0]) for b in loader] == draws[0]


def test_batch_transform_contract_is_checked_with_messages_that_say_the_fix(image_folder):
    with pytest.raises(ConfigError, match="give a function"):
        stoker.Loader(image_folder, batch_transform=3, **KW)
    with pytest.raises(TypeError, match="image stays uint8"):
        stoker.Loader(image_folder, batch_transform=lambda b, r: {"image": b["image"] / 255}, **KW)
    with pytest.raises(TypeError, match="never index"):
        stoker.Loader(image_folder, batch_transform=lambda b, r: {"index": b["index"]}, **KW)

    def changes_shape(batch, rng):  # probed on zeros, then another shape on real data
        k = 1 if batch["image"].any() else 2
        return {"label": np.zeros((len(batch["label"]), k), np.float32)}

    with stoker.Loader(image_folder, workers=0, batch_transform=changes_shape, **KW) as loader:
        with pytest.raises(TypeError, match="same fields with the same dtype and shape"):
            next(iter(loader))


@pytest.mark.timeout(300)
def test_peek_shows_the_next_batch_without_taking_it_workers_running_or_not(image_folder):
    with stoker.Loader(image_folder, workers=2, batch_transform=mixup, **KW) as loader:
        state = loader.state_dict()
        first = tuple(np.array(v) for v in loader.peek())
        assert loader.state_dict() == state
        batches = iter(loader)
        _same([first], [tuple(np.array(v) for v in next(batches))])
        second = tuple(np.array(v) for v in loader.peek())  # workers running now
        _same([tuple(np.array(v) for v in loader.peek(0))], [first])
        after = loader.state_dict()
        _same([second], [tuple(np.array(v) for v in next(batches))])
        assert after["position"] == 1
        rest = list(batches)
        assert len(rest) == len(loader) - 2
        with pytest.raises(ConfigError, match="peek"):
            loader.peek(len(loader))
        nxt = tuple(np.array(v) for v in loader.peek())  # epoch over: the next epoch's first
    with stoker.Loader(image_folder, workers=0, batch_transform=mixup, **KW) as fresh:
        fresh.set_epoch(1)
        _same([nxt], [tuple(np.array(v) for v in next(iter(fresh)))])


def test_dataset_sampler_and_batch_size_read_as_a_dataloader_s(image_folder):
    pytest.importorskip("torch")
    train, val = stoker.Loader(image_folder, **HALVES)
    with train, val:
        assert len(train.dataset) + len(val.dataset) == 36
        assert len(val.dataset) == sum(len(b[1]) for b in val)  # torchvision's evaluate check
        assert train.dataset.classes == train.class_names
        assert train.dataset.class_to_idx == {c: k for k, c in enumerate(train.class_names)}
        view = train.torch()
        assert view.batch_size == 4 and len(view.dataset) == len(train.dataset)
        assert len(view.sampler) == len(train.dataset) and view.drop_last is True
        view.sampler.set_epoch(3)
        assert train.state_dict()["epoch"] == 3 and view.sampler.epoch == 3
        next(iter(view))
        view.sampler.set_epoch(3)  # an epoch broken off starts again, as a DataLoader's
        assert train.state_dict()["position"] == 0
        view.load_state_dict(train.advance_state(train.state_dict(), 1))
        view.sampler.set_epoch(3)  # the current epoch, resumed: the position is kept
        assert train.state_dict()["position"] == 1
        view.sampler.set_epoch(4)
        assert train.state_dict()["position"] == 0
    with stoker.Loader(image_folder, batch_size=4, rank=1, world_size=2, workers=0) as ranked:
        assert len(ranked.sampler) == 18 and ranked.sampler.num_replicas == 2
        assert ranked.sampler.rank == 1 and len(ranked.dataset) == 36


def test_subset_both_gives_each_half_its_own_augment_and_batch_transform(image_folder):
    train, val = stoker.Loader(
        image_folder,
        **HALVES,
        augment={"training": "train", "validation": None},
        batch_transform={"training": mixup},
    )
    with train, val:
        assert "augment='train'" in repr(train) and "augment=None" in repr(val)
        assert next(iter(train))[1].dtype == np.float32
        assert next(iter(val))[1].dtype == np.int64
    with pytest.raises(ConfigError, match="'training' and 'validation'"):
        stoker.Loader(
            image_folder, validation_split=0.25, subset="both", augment={"train": "train"}
        )
    with pytest.raises(ConfigError, match="pass subset='both'"):
        stoker.Loader(image_folder, augment={"training": "train", "validation": "eval"})


def _noisy(image, rng):
    """A ported transform that draws from the global RNGs, as torchvision's do."""
    import random

    return np.roll(image, random.randrange(4) + int(np.random.randint(4)), axis=1)


def test_peek_and_the_probe_leave_the_users_global_rngs_alone(image_folder):
    import random

    random.seed(1)
    np.random.seed(1)
    want = (random.random(), np.random.random())
    random.seed(1)
    np.random.seed(1)

    def draws(batch, rng):
        random.random(), np.random.random()

    with stoker.Loader(image_folder, workers=0, augment=_noisy, batch_transform=draws, **KW) as lo:
        lo.peek()
        lo.peek(1)
    assert (random.random(), np.random.random()) == want


@pytest.mark.timeout(300)
def test_cutmix_on_masks_pastes_the_mask_box_with_the_image_box(tmp_path):
    from PIL import Image

    from stoker.datasets import make_image_folder

    root = make_image_folder(tmp_path / "p", classes=1, per_class=8, min_side=40, max_side=60)
    rows = ["image,mask"]
    for k, photo in enumerate(sorted(root.glob("*/*.jpg"))):
        w, h = Image.open(photo).size
        Image.fromarray((np.indices((h, w)).sum(0) // 7 % 5).astype(np.uint8)).save(
            tmp_path / f"m{k}.png"
        )
        rows.append(f"{photo},m{k}.png")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    kw = dict(batch_size=4, image_size=24, augment="eval", seed=4)
    with stoker.Loader(tmp_path / "pairs.csv", workers=0, **kw) as plain:
        x0, m0 = (np.array(v) for v in next(iter(plain)))
    with stoker.Loader(
        tmp_path / "pairs.csv", workers=2, batch_transform=cutmix_masks, **kw
    ) as mixed:
        x, m = (np.array(v) for v in next(iter(mixed)))
    y_0, y_1, x_0, x_1 = cutmix_box(24, 24, batch_rng(4, 0, 0))
    assert y_1 > y_0 and x_1 > x_0
    box = np.s_[:, y_0:y_1, x_0:x_1]
    want_x, want_m = x0.copy(), m0.copy()
    want_x[box], want_m[box] = np.roll(x0, 1, axis=0)[box], np.roll(m0, 1, axis=0)[box]
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(m, want_m)
