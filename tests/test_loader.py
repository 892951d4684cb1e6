"""The Loader end to end with real worker processes: shapes, determinism, resume, stats."""

import json

import numpy as np
import pytest

import helpers
import stoker
from stoker.errors import ConfigError, StokerError
from stoker.loader import config


def batches(loader):
    """One epoch, copied (so the comparison does not depend on slot reuse)."""
    return [(x.copy(), y.copy()) for x, y in loader]


def same(a, b):
    if len(a) != len(b):
        return False
    pairs = zip(a, b, strict=True)
    return all(np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2) in pairs)


@pytest.mark.timeout(60)
def test_batches_have_the_promised_shape(image_folder):
    with stoker.Loader(image_folder, batch_size=8, image_size=(32, 40), workers=2) as loader:
        assert len(loader) == 4  # 36 samples, shuffle -> drop_last
        got = batches(loader)
    assert len(got) == 4
    for x, y in got:
        assert x.shape == (8, 32, 40, 3) and x.dtype == np.uint8 and x.flags.c_contiguous
        assert y.shape == (8,) and y.dtype == np.int64 and set(y.tolist()) <= {0, 1, 2}


@pytest.mark.timeout(60)
def test_eval_loader_keeps_every_sample_in_order(image_folder):
    with stoker.Loader(
        image_folder, batch_size=10, image_size=32, augment="eval", shuffle=False, workers=2
    ) as loader:
        got = batches(loader)
    assert [len(y) for _, y in got] == [10, 10, 10, 6]
    labels = np.concatenate([y for _, y in got])
    assert labels.tolist() == sorted(labels.tolist())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("augment", ["train", "eval", None])
def test_same_seed_same_batches_whatever_the_worker_count(image_folder, augment):
    def run(workers, seed=0):
        with stoker.Loader(
            image_folder, batch_size=6, image_size=24, augment=augment, workers=workers, seed=seed
        ) as loader:
            return batches(loader) + batches(loader)

    inline = run(0)
    assert same(inline, run(2))
    assert not same(inline, run(0, seed=1))
    half = len(inline) // 2
    assert not same(inline[:half], inline[half:])  # epochs differ


@pytest.mark.timeout(60)
def test_resume_mid_epoch_in_a_new_loader_with_other_workers(image_folder):
    kw = dict(batch_size=4, image_size=16, seed=5)
    with stoker.Loader(image_folder, workers=0, **kw) as loader:
        full = batches(loader) + batches(loader)
    with stoker.Loader(image_folder, workers=2, **kw) as loader:
        first = batches(loader)
        it = iter(loader)
        first += [tuple(a.copy() for a in next(it)) for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict()))
    with stoker.Loader(image_folder, workers=1, **kw) as loader:
        loader.load_state_dict(state)
        rest = batches(loader)
    assert same(first + rest, full)


@pytest.mark.timeout(60)
def test_state_of_another_dataset_is_refused(image_folder):
    with stoker.Loader(image_folder, batch_size=4, workers=0) as loader:
        state = loader.state_dict()
    with stoker.Loader(image_folder, batch_size=4, seed=1, workers=0) as other:
        with pytest.raises(ConfigError, match="different seed"):
            other.load_state_dict(state)
    state["fingerprint"] = "0" * 24
    with stoker.Loader(image_folder, batch_size=4, workers=0) as loader:
        with pytest.raises(ConfigError, match="another dataset"):
            loader.load_state_dict(state)


@pytest.mark.timeout(60)
def test_batches_kept_by_the_consumer_are_never_overwritten(image_folder):
    kw = dict(batch_size=4, image_size=16, augment="eval", shuffle=False)
    with stoker.Loader(image_folder, workers=0, **kw) as loader:
        expected = batches(loader)
    with stoker.Loader(image_folder, workers=2, prefetch=1, **kw) as loader:
        kept = list(loader)  # no copies: every batch must stay intact
        assert loader.stats().kept_batches > 0
        assert same([(x, y) for x, y in kept], expected)
        del kept


@pytest.mark.timeout(60)
def test_in_process_batches_reuse_memory_only_when_nothing_holds_it():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 160, 160, 3), dtype=np.uint8)  # 1.2 MB per batch of 16
    targets = rng.random((64, 3), np.float32)
    with stoker.Loader(images, labels=targets, batch_size=16, workers=0, batch="dict") as loader:
        blocks = []
        for b in loader:  # held one batch at a time: two blocks take turns
            assert np.array_equal(b["image"], images[b["index"]])
            assert np.array_equal(b["label"], targets[b["index"]])
            blocks.append(b["image"].base)
        assert len({id(m) for m in blocks}) == 2, blocks
        kept = list(loader)  # every batch kept: none is overwritten, each has its own memory
        slices = []
        for b in loader:  # only a view of part of each batch kept: that part stays intact
            slices.append((b["image"][3:5], b["index"][3:5].copy()))
        for b in kept:
            assert np.array_equal(b["image"], images[b["index"]])
        assert len({id(b["image"].base) for b in kept}) == len(kept)
        for part, index in slices:
            assert np.array_equal(part, images[index])
        assert loader.stats().kept_batches == 0


@pytest.mark.timeout(60)
def test_break_then_iterate_again_continues_the_epoch(image_folder):
    kw = dict(batch_size=4, image_size=16, workers=2)
    with stoker.Loader(image_folder, **kw) as loader:
        whole = batches(loader)
    with stoker.Loader(image_folder, **kw) as loader:
        part = []
        for x, y in loader:
            part.append((x.copy(), y.copy()))
            if len(part) == 3:
                break
        part += batches(loader)
        assert loader.state_dict()["epoch"] == 1
    assert same(part, whole)


@pytest.mark.timeout(60)
def test_arrays_npy_and_user_transforms_run_in_workers(tmp_path):
    images = helpers.make_marked_array(n=20, marked=0)
    np.save(tmp_path / "x.npy", images)
    for source in (images, tmp_path / "x.npy"):
        with stoker.Loader(
            source,
            labels=np.arange(20),
            batch_size=5,
            image_size=24,
            augment=helpers.invert,
            shuffle=False,
            workers=2,
        ) as loader:
            x, y = next(iter(loader))
        assert np.array_equal(x, 255 - images[:5]) and y.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.timeout(60)
def test_random_user_transform_and_op_lists_are_deterministic(image_folder):
    ops = [stoker.ops.RandomResizedCrop(), stoker.ops.HorizontalFlip(), helpers.jitter]
    runs = []
    for workers in (0, 2):
        with stoker.Loader(
            image_folder, batch_size=6, image_size=20, augment=ops, workers=workers
        ) as loader:
            runs.append(batches(loader))
    assert same(*runs)


@pytest.mark.timeout(60)
def test_stats_answer_is_my_gpu_waiting(image_folder):
    with stoker.Loader(image_folder, batch_size=6, image_size=24, workers=2) as loader:
        batches(loader)
        report = loader.stats()
    assert report.batches == 6 and report.images == 36
    assert report.images_per_s > 0 and 0 <= report.wait_share <= 1
    assert report.decode_ms > 0 and report.skipped == 0 and report.workers == 2
    text = str(report)
    assert "img/s" in text and "waited for data" in text and "bottleneck" in text


@pytest.mark.timeout(60)
def test_closed_loader_refuses_to_iterate_and_close_is_idempotent(image_folder):
    loader = stoker.Loader(image_folder, batch_size=6, image_size=16, workers=1)
    next(iter(loader))
    loader.close()
    loader.close()
    with pytest.raises(StokerError, match="closed"):
        next(iter(loader))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(image_size=(3,)), "image_size"),
        (dict(workers=-1), "workers"),
        (dict(augment="sharpen"), "augment"),
        (dict(max_errors=1.5), "max_errors"),
        (dict(start_method="fork"), "fork"),
        (dict(rank=1), "rank= and world_size="),
        (dict(batch_size=100), "no full batch"),
        (dict(fast_decode="yes"), "fast_decode"),
        (dict(rank_split="even"), "rank_split='even'.*'once'"),
    ],
)
def test_bad_arguments_say_how_to_fix_them(image_folder, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        stoker.Loader(image_folder, **kwargs)


@pytest.mark.timeout(60)
def test_ranks_get_disjoint_samples_and_equal_batch_counts(image_folder):
    seen, counts = [], []
    for rank in range(3):
        with stoker.Loader(
            image_folder / "labels.csv",
            batch_size=5,
            image_size=16,
            workers=0,
            rank=rank,
            world_size=3,
            augment="eval",
        ) as loader:
            counts.append(len(loader))
            seen.append(loader.recipe.plan.order(0))
    assert len(set(counts)) == 1
    assert not set(seen[0]) & set(seen[1]) and not set(seen[1]) & set(seen[2])


@pytest.mark.timeout(60)
def test_auto_workers_follow_the_measured_cost(image_folder):
    tiny = np.zeros((40, 8, 8, 3), np.uint8)
    with stoker.Loader(tiny, batch_size=4, image_size=8, augment=None) as cheap:
        next(iter(cheap))
        report = cheap.stats()
    assert report.workers == 0 and "ms/img measured" in report.workers_reason
    assert "in this process" in report.workers_reason and "in this process" in str(report)
    with stoker.Loader(image_folder, batch_size=12, image_size=64) as real:
        next(iter(real))
        assert "measured" in real.stats().workers_reason


def test_auto_workers_leave_the_training_process_cores_on_many_core_hosts():
    count = {cpus: config.auto_count(cpus)[0] for cpus in (1, 2, 8, 9, 16, 24, 36, 64, 256)}
    assert count == {1: 1, 2: 2, 8: 8, 9: 8, 16: 14, 24: 21, 36: 32, 64: 32, 256: 32}
    assert "one in 8 left to the training process" in config.auto_count(16)[1]
    assert "at most 32" in config.auto_count(64)[1]


def test_auto_workers_is_one_rule_at_construction_and_at_the_first_batch(monkeypatch):
    monkeypatch.setattr(config, "usable_cpus", lambda: 64)
    at_start, why = config.workers("auto")
    measured, reason = config.auto_workers(0.01, 32, 12)
    unmeasured = config.auto_workers(None, 32, 12)[0]
    assert at_start == measured == unmeasured == config.auto_count(64)[0] == 32
    assert "left to the training process" in why and "left to the training process" in reason


@pytest.mark.parametrize(
    "old,new",
    [
        ("layout", lambda ld: ld.recipe.schema.slot_layout),
        ("source", lambda ld: ld.recipe.source),
        ("plan", lambda ld: ld.recipe.plan),
        ("classes", lambda ld: ld.class_names),
    ],
)
def test_old_loader_names_warn_and_give_what_their_replacement_gives(image_folder, old, new):
    with stoker.Loader(image_folder, batch_size=4, workers=0) as loader:
        with pytest.warns(DeprecationWarning, match=rf"Loader\.{old} .*removed in stoker 0\.3"):
            assert getattr(loader, old) == new(loader)


def test_loader_augment_is_deprecated_and_the_repr_shows_it_resolved(image_folder):
    kw = dict(batch_size=4, workers=0, validation_split=0.5, subset="validation")
    with stoker.Loader(image_folder, **kw) as loader:
        with pytest.warns(DeprecationWarning, match="loader.options.image.augment"):
            assert loader.augment == "eval"
        assert "augment='eval'" in repr(loader) and loader.options.image.augment == "auto"


def test_start_method_is_deprecated_and_changes_nothing(image_folder):
    with pytest.warns(DeprecationWarning, match=r"start_method=\) is deprecated.*drop") as caught:
        loader = stoker.Loader(image_folder, batch_size=4, workers=0, start_method="spawn")
    assert caught[0].filename == __file__  # the user's line
    with loader:
        assert loader.options.run.start_method == "spawn"


@pytest.mark.timeout(60)
def test_fast_decode_auto_is_fast_for_train_and_exact_for_eval(image_folder):
    """'auto' picks libjpeg's fast IDCT only for training; eval matches an explicit exact decode
    and a fast train decode differs from an exact one by at most a few levels."""
    kinds = {}
    for augment, fast in [("train", "auto"), ("train", False), ("eval", "auto"), ("eval", False)]:
        loader = stoker.Loader(
            image_folder, batch_size=8, augment=augment, workers=0, fast_decode=fast
        )
        kinds[augment, fast] = (loader.recipe.pipeline.fast, next(iter(loader))[0].copy())
        loader.close()
    assert kinds["train", "auto"][0] and not kinds["eval", "auto"][0]
    np.testing.assert_array_equal(kinds["eval", "auto"][1], kinds["eval", False][1])
    fast, exact = kinds["train", "auto"][1], kinds["train", False][1]
    assert not np.array_equal(fast, exact)
    assert np.abs(fast.astype(int) - exact.astype(int)).mean() < 2.0
