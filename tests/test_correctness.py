"""What a batch says is true of the source the user passed, through every selection and every
structure: ``index``/``path`` and the per-sample arrays (``sample_weight=``, ``fields=``, masks)
after a split, a stratified split, a class selection, rank sharding and a resume (property tests
over random selections)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import stoker
from stoker.errors import ConfigError

N = 23
NAMES = ["cat", "dog", "eel"]
TEXT = [NAMES[(i * 7) % 3] for i in range(N)]  # text labels: the source has class names
WEIGHT = np.arange(N, dtype=np.float64) / 4
GT = np.stack([np.arange(N) * 10, np.arange(N) * -1], axis=1).astype(np.int32)


def _numbered(n: int) -> np.ndarray:
    """Images whose first pixel spells their index: (i % 256, i // 256, 0)."""
    x = np.zeros((n, 4, 4, 3), np.uint8)
    x[:, 0, 0, 0], x[:, 0, 0, 1] = np.arange(n) % 256, np.arange(n) // 256
    return x


@st.composite
def selections(draw: st.DrawFn) -> dict:
    """Loader arguments that select samples: split, stratify, classes, ranks, order."""
    kw: dict = {}
    split = draw(st.sampled_from([None, 0.2, 0.3, 0.5, 0.75]))
    if split is not None:
        kw.update(
            validation_split=split,
            subset=draw(st.sampled_from(["training", "validation"])),
            stratify=draw(st.booleans()),
        )
    if draw(st.booleans()):
        picked = draw(st.permutations(NAMES))
        kw["class_names"] = picked[: draw(st.integers(1, len(NAMES)))]
    world = draw(st.integers(1, 3))
    if world > 1:
        kw.update(rank=draw(st.integers(0, world - 1)), world_size=world)
    kw.update(
        batch_size=draw(st.integers(1, 5)),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
        drop_last=False,
        workers=0,
        batch="dict",
    )
    return kw


def _loader(source, **kw) -> stoker.Loader:
    try:
        return stoker.Loader(source, **kw)
    except ConfigError as exc:  # an empty selection (or a class absent from a subset)
        assume("empty" not in str(exc))
        raise


def _check_resume(source, kw: dict, batches: list[dict]) -> None:
    """A loader resumed after the first batch gives the second as the first run did."""
    if len(batches) < 2:
        return
    with _loader(source, **kw) as run:
        it = iter(run)
        next(it)
        state = run.state_dict()
    with _loader(source, **kw) as resumed:
        resumed.load_state_dict(state)
        again = next(iter(resumed))
    for name, value in batches[1].items():
        assert np.array_equal(again[name], value), name


@pytest.mark.timeout(300)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kw=selections())
def test_index_path_and_arrays_name_the_source_sample_through_any_array_selection(kw):
    x = _numbered(N)
    kw.update(labels=TEXT, sample_weight=WEIGHT, fields={"gt": GT}, augment=None)
    with _loader(x, **kw) as loader:
        batches = list(loader)
        classes = loader.class_names
    seen = np.concatenate([b["index"] for b in batches])
    assert len(set(seen.tolist())) == len(seen)  # each sample once per epoch
    for b in batches:
        index = b["index"]
        assert ((0 <= index) & (index < N)).all()
        pixel = b["image"][:, 0, 0, :2].astype(np.int64)
        spelled = pixel[:, 0] + 256 * pixel[:, 1]
        assert spelled.tolist() == index.tolist()  # the pixels are those of source sample index
        assert b["path"].tolist() == [f"array[{i}]" for i in index]
        assert np.array_equal(b["weight"], WEIGHT[index].astype(np.float32))
        assert np.array_equal(b["gt"], GT[index])
        assert [classes[k] for k in b["label"]] == [TEXT[i] for i in index]
    if "class_names" in kw:
        assert {TEXT[i] for i in seen} <= set(kw["class_names"])
    if "validation_split" in kw and "world_size" not in kw:  # the two halves tile the classes
        other = "validation" if kw["subset"] == "training" else "training"
        with _loader(x, **{**kw, "subset": other}) as rest:
            theirs = np.concatenate([b["index"] for b in rest])
        wanted = set(kw.get("class_names", NAMES))
        assert not set(seen.tolist()) & set(theirs.tolist())
        assert set(seen.tolist()) | set(theirs.tolist()) == {
            i for i in range(N) if TEXT[i] in wanted
        }
    _check_resume(x, kw, batches)


@pytest.fixture(scope="module")
def folder_truth(image_folder):
    """The folder's own listing: path and class of each source index."""
    with stoker.Loader(image_folder, workers=0, image_size=8, batch_size=4) as whole:
        return whole.file_paths, whole.class_names, np.asarray(whole.recipe.source.labels)


@pytest.mark.timeout(300)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(kw=selections())
def test_index_path_and_arrays_name_the_source_sample_through_any_folder_selection(
    kw, image_folder, folder_truth
):
    paths, names, labels = folder_truth
    n = len(paths)
    kw.pop("class_names", None)
    if kw["seed"] % 2:
        kw["class_names"] = ["class_002", "class_000"][: 1 + kw["seed"] % 3 // 2]
    weight = np.arange(n, dtype=np.float32) + 0.5
    gt = np.arange(n, dtype=np.int64)[:, None] * 3
    kw.update(sample_weight=weight, fields={"gt": gt}, image_size=8, augment=None)
    with _loader(image_folder, **kw) as loader:
        batches = list(loader)
        classes = loader.class_names
    for b in batches:
        index = b["index"]
        assert b["path"].tolist() == [paths[i] for i in index]
        assert np.array_equal(b["weight"], weight[index])
        assert np.array_equal(b["gt"], gt[index])
        assert [classes[k] for k in b["label"]] == [names[labels[i]] for i in index]
    _check_resume(image_folder, kw, batches)


@pytest.mark.timeout(180)
def test_the_issue_reproducer_gives_the_source_index_in_workers_too():
    x = _numbered(10)
    for workers in (0, 2):
        with stoker.Loader(
            x,
            validation_split=0.2,
            subset="validation",
            batch_size=2,
            batch="dict",
            workers=workers,
            shuffle=False,
        ) as loader:
            b = next(iter(loader))
        assert b["path"].tolist() == ["array[7]", "array[8]"]
        assert b["index"].tolist() == [7, 8]


@pytest.mark.timeout(120)
def test_per_sample_arrays_take_the_source_length_and_refuse_the_selection_length():
    x = _numbered(10)
    kw = dict(validation_split=0.2, subset="training", batch_size=4, workers=0, batch="dict")
    with stoker.Loader(x, sample_weight=np.arange(10.0), fields={"f": np.arange(10)}, **kw) as ok:
        for b in ok:
            assert np.array_equal(b["weight"], b["index"].astype(np.float32))
            assert np.array_equal(b["f"], b["index"])
    with pytest.raises(ConfigError, match=r"source you passed \(10\).*source_indices"):
        stoker.Loader(x, sample_weight=np.ones(8), **kw)
    with pytest.raises(ConfigError, match=r"fields\['f'\].*\(10\)"):
        stoker.Loader(x, fields={"f": np.ones(8)}, **kw)
    with stoker.Loader(x, **kw) as loader:
        assert loader.source_indices.tolist() == [int(p[6:-1]) for p in loader.file_paths]


@pytest.mark.timeout(120)
def test_masks_follow_their_source_sample_through_a_split():
    x = _numbered(12)
    masks = x[:, :, :, 0].copy()  # each mask spells its image's index too
    with stoker.Loader(
        x,
        masks=masks,
        validation_split=0.25,
        subset="validation",
        augment=None,
        batch_size=3,
        workers=0,
        batch="dict",
    ) as loader:
        for b in loader:
            assert b["mask"][:, 0, 0].tolist() == b["index"].tolist()
            assert b["image"][:, 0, 0, 0].tolist() == b["index"].tolist()


class Numbered:
    """A per-sample dataset whose sample ``i`` spells ``i``."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return np.full((2, 2, 3), i, np.uint8), np.int64(i)


@pytest.mark.timeout(120)
def test_a_dataset_can_be_split_and_its_index_is_the_dataset_index():
    with stoker.Loader(
        Numbered(),
        validation_split=0.3,
        subset="validation",
        batch_size=2,
        workers=0,
        batch="dict",
        shuffle=False,
    ) as loader:
        batches = list(loader)
    assert sum(len(b["index"]) for b in batches) == 3
    for b in batches:
        assert b["1"].tolist() == b["index"].tolist()
        assert b["path"].tolist() == [f"dataset[{i}]" for i in b["index"]]


# --------------------------------------------------------------------------- dtypes


def _adapter_batch(kind: str, loader, dtype, mean, std) -> np.ndarray:
    """The first image batch through adapter ``kind``, as float32 numpy (B, H, W, C)."""
    if kind == "torch":
        import torch

        x = next(
            iter(
                loader.torch(
                    dtype=getattr(torch, dtype), mean=mean, std=std, layout="channels_last"
                )
            )
        )[0]
        assert x.dtype == getattr(torch, dtype)
        return x.float().numpy()
    if kind == "jax":
        import jax.numpy as jnp

        x = next(iter(loader.jax(dtype=getattr(jnp, dtype), mean=mean, std=std)))[0]
    elif kind == "keras":
        x = loader.keras(dtype=dtype, mean=mean, std=std)[0][0]
    else:
        x = next(iter(loader.tf(dtype=dtype, mean=mean, std=std)))[0].numpy()
    assert np.asarray(x).dtype.name == dtype
    return np.asarray(x).astype(np.float32)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["torch", "jax", "keras", "tf"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_adapter_normalises_into_float16_and_bfloat16(kind, dtype):
    x = np.random.default_rng(1).integers(0, 256, size=(4, 5, 6, 3), dtype=np.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    want = (x / 255.0 - np.array(mean)) / np.array(std)
    tol = 0.02 if dtype == "float16" else 0.05  # bfloat16 keeps 8 bits of mantissa
    with stoker.Loader(x, batch_size=4, workers=0, shuffle=False, augment=None) as loader:
        got = _adapter_batch(kind, loader, dtype, mean, std)
        assert np.allclose(got, want, rtol=tol, atol=tol)
        unit = _adapter_batch(kind, loader, dtype, 0, 1)
        assert np.allclose(unit, x / 255.0, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- error budget


def _bad_folder(tmp_path, bad: int) -> list[str]:
    from PIL import Image

    files = []
    for i in range(8):
        path = tmp_path / f"img{i}.png"
        if i < bad:
            path.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
        else:
            Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(path)
        files.append(str(path))
    return files


@pytest.mark.timeout(120)
@pytest.mark.parametrize("budget", [0, 1])
def test_past_max_errors_it_raises_without_warning_beyond_the_budget(tmp_path, budget):
    import warnings

    files = _bad_folder(tmp_path, bad=3)
    with stoker.Loader(
        paths=files,
        labels=[0] * 8,
        batch_size=8,
        image_size=8,
        workers=0,
        shuffle=False,
        max_errors=budget,
    ) as loader:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(stoker.TooManyErrors, match=f"more than max_errors={budget}"):
                next(iter(loader))
    skipped = [str(w.message) for w in seen if "stoker skipped" in str(w.message)]
    assert len(skipped) == budget, skipped
    assert all(f"of max_errors={budget} used" in m for m in skipped)


# --------------------------------------------------------------------------- global RNGs


def _run(folder, augment, workers: int, resume_after: int | None = None) -> list[np.ndarray]:
    """Images of one epoch and the first batch of the next (resumed after ``resume_after``
    batches from a fresh loader's state, when given)."""
    kw = dict(batch_size=6, image_size=16, seed=3, augment=augment, workers=workers)
    with stoker.Loader(folder, **kw) as loader:
        if resume_after is None:
            return [b[0].copy() for b in loader] + [next(iter(loader))[0].copy()]
        it = iter(loader)
        head = [next(it)[0].copy() for _ in range(resume_after)]
        state = loader.state_dict()
    with stoker.Loader(folder, **kw) as resumed:
        resumed.load_state_dict(state)
        return head + [b[0].copy() for b in resumed] + [next(iter(resumed))[0].copy()]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["torchvision_style", "albumentations_style"])
def test_augments_on_the_global_rngs_give_the_same_batches_in_workers_inline_and_resumed(
    name, image_folder
):
    import helpers

    augment = getattr(helpers, name)
    before = np.random.get_state()[1].copy()
    inline = _run(image_folder, augment, workers=0)
    assert np.array_equal(np.random.get_state()[1], before)  # the user's state put back
    workers = _run(image_folder, augment, workers=2)
    resumed = _run(image_folder, augment, workers=2, resume_after=2)
    assert len(inline) == len(workers) == len(resumed) == 7
    for a, b, c in zip(inline, workers, resumed, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    again = _run(image_folder, augment, workers=0)
    assert all(np.array_equal(a, b) for a, b in zip(inline, again, strict=True))
    inline_kw = dict(batch_size=6, image_size=16, augment=augment, workers=0, shuffle=False)
    with (
        stoker.Loader(image_folder, seed=3, **inline_kw) as a,
        stoker.Loader(image_folder, seed=4, **inline_kw) as b,
    ):
        assert not np.array_equal(next(iter(a))[0], next(iter(b))[0])  # the seed counts


@pytest.mark.timeout(300)
def test_a_batch_transform_on_the_global_rng_is_the_same_in_workers_and_inline(image_folder):
    import helpers

    runs = []
    for workers in (0, 2):
        with stoker.Loader(
            image_folder,
            batch_size=6,
            image_size=16,
            seed=5,
            workers=workers,
            batch_transform=helpers.batch_noise,
        ) as loader:
            runs.append([b[0].copy() for b in loader])
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))


# --------------------------------------------------------------------------- HF path-only rows


def _hf_parquet(folder, stored_paths: list[str | None], embed: tuple[int, ...] = ()) -> str:
    """A Parquet file in the layout ``datasets``' ``to_parquet()`` writes for images loaded
    from local files: ``image: struct{bytes, path}`` with bytes null and the path set (rows in
    ``embed`` carry their bytes, as pushed datasets do)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    (folder / "imgs").mkdir(exist_ok=True)
    cells = []
    for i, stored in enumerate(stored_paths):
        buf = io.BytesIO()
        Image.fromarray(np.full((6, 6, 3), 20 * i, np.uint8)).save(buf, format="PNG")
        (folder / "imgs" / f"{i}.png").write_bytes(buf.getvalue())
        cells.append({"bytes": buf.getvalue() if i in embed else None, "path": stored})
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {"image": pa.array(cells, type=kind), "label": pa.array(range(len(cells)), pa.int64())}
    )
    out = folder / "train.parquet"
    pq.write_table(table, out, row_group_size=3)
    return str(out)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_hugging_face_rows_with_a_path_and_no_bytes_read_the_file(tmp_path, workers):
    stored = [str(tmp_path / "imgs" / f"{i}.png") if i % 2 else f"imgs/{i}.png" for i in range(7)]
    parquet = _hf_parquet(tmp_path, stored, embed=(4,))
    with stoker.Loader(
        parquet,
        batch_size=7,
        image_size=6,
        augment=None,
        shuffle=False,
        workers=workers,
        max_errors=0,
        batch="dict",
    ) as loader:
        b = next(iter(loader))
    assert b["label"].tolist() == list(range(7))
    assert b["image"][:, 0, 0, 0].tolist() == [20 * i for i in range(7)]


@pytest.mark.timeout(120)
def test_a_path_only_row_whose_file_is_missing_or_escapes_is_refused_at_construction(tmp_path):
    stored = [f"imgs/{i}.png" for i in range(4)]
    stored[2] = "imgs/gone.png"
    parquet = _hf_parquet(tmp_path, stored)
    with pytest.raises(stoker.SourceError, match=r"(?s)train\.parquet.*row 2.*gone\.png.*embed"):
        stoker.Loader(parquet, batch_size=2, image_size=6)
    (tmp_path / "inner").mkdir()
    escaping = _hf_parquet(tmp_path / "inner", ["../imgs/0.png", "imgs/1.png"])
    with pytest.raises(stoker.SourceError, match=r"row 0.*outside the Parquet file's folder"):
        stoker.Loader(escaping, batch_size=2, image_size=6)


@pytest.mark.timeout(60)
def test_a_path_only_row_naming_a_fifo_is_refused_as_not_a_regular_file(tmp_path):
    """A FIFO (which a read would block on) exists: it is named as what it is, not as "a path
    to a file that does not exist"."""
    import os

    stored = [f"imgs/{i}.png" for i in range(4)]
    stored[1] = "imgs/pipe.png"
    parquet = _hf_parquet(tmp_path, stored)
    os.mkfifo(tmp_path / "imgs" / "pipe.png")
    with pytest.raises(stoker.SourceError) as err:
        stoker.Loader(parquet, batch_size=2, image_size=6)
    text = str(err.value)
    assert "1 of 4 rows hold no image bytes, only a path to something that is not a regular" in text
    assert "row 1: " + str(tmp_path / "imgs" / "pipe.png") + " (a FIFO)" in text
    assert "does not exist" not in text


# --------------------------------------------------------------------------- image leaves

KINDS = {  # a dataset field: per-sample value of sample i
    "pixels": lambda i: np.full((4, 5, 3), 10 * i, np.uint8),  # uint8 (H, W, C)
    "chw": lambda i: np.full((3, 4, 5), i / 10, np.float32),  # ToTensor's float (C, H, W)
    "vector": lambda i: np.full((6,), i, np.float32),
    "label": lambda i: np.int64(i),
}


class Structured:
    """A dataset whose samples are a dict, a tuple or one array of the given field kinds."""

    def __init__(self, shape: str, kinds: list[str]) -> None:
        self.shape, self.kinds = shape, kinds

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        values = [KINDS[k](i) for k in self.kinds]
        if self.shape == "dict":
            return {f"f{k}": v for k, v in enumerate(values)}
        return tuple(values) if self.shape == "tuple" else values[0]


def _leaves(batch, shape: str) -> list:
    if shape == "dict":
        return [batch[f"f{k}"] for k in range(len(batch))]
    return list(batch) if shape == "tuple" else [batch]


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().float().numpy() if x.is_floating_point() else x.numpy()
    return np.asarray(x)


def _first(kind: str, loader, **options):
    if kind == "torch":
        import torch

        if "dtype" in options:
            options["dtype"] = getattr(torch, options["dtype"])
        return next(iter(loader.torch(**options)))
    if kind == "jax":
        return next(iter(loader.jax(**options)))
    return loader.keras(**options)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("adapter", ["torch", "jax", "keras"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(["dict", "tuple", "single"]),
    kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3),
    normalise=st.booleans(),
)
def test_image_options_reach_every_image_leaf_of_any_structure_or_are_refused(
    adapter, shape, kinds, normalise
):
    pytest.importorskip(adapter)  # outside Hypothesis, which would group a missing module
    if shape == "single":
        kinds = kinds[:1]
    options = {"dtype": "float16"}
    if normalise:
        options.update(mean=0, std=1)
    images = [k for k in kinds if k in ("pixels", "chw")]
    with stoker.Loader(Structured(shape, kinds), batch_size=3, shuffle=False, workers=0) as loader:
        if not images or (normalise and "chw" in images):
            with pytest.raises(ConfigError, match="f0|'0'|'x'|'1'|'2'|f1|f2") as refused:
                _first(adapter, loader, **options)
            culprit = "chw" if images else None
            if culprit is not None:  # the message names the float field
                assert "float32 (3, 4, 5)" in str(refused.value)
            return
        batch = _first(adapter, loader, **options)
    for kind, leaf in zip(kinds, _leaves(batch, shape), strict=True):
        value = _as_numpy(leaf)
        if kind in ("pixels", "chw"):
            assert str(getattr(leaf, "dtype", "")).endswith("float16"), (kind, leaf.dtype)
        if kind == "pixels":
            want = np.full((3, 4, 5, 3), 0.0) + (np.arange(3) * 10.0)[:, None, None, None]
            want = want / 255 if normalise else want
            if adapter == "torch":  # torch's default layout: (B, C, H, W)
                want = want.transpose(0, 3, 1, 2)
            assert value.shape == want.shape and np.allclose(value, want, rtol=1e-2)
        elif kind == "chw":
            assert value.shape == (3, 3, 4, 5)
            assert np.allclose(value[:, 0, 0, 0], np.arange(3) / 10, atol=1e-3)
        elif kind == "vector":
            assert str(leaf.dtype).endswith("float32")
        else:
            assert "int" in str(leaf.dtype)


@pytest.mark.timeout(300)
def test_tf_converts_a_tuple_datasets_image_leaves():
    with stoker.Loader(
        Structured("tuple", ["pixels", "chw", "label"]), batch_size=3, shuffle=False, workers=0
    ) as loader:
        pixels, chw, label = next(iter(loader.tf(dtype="float16")))
        assert pixels.dtype.name == chw.dtype.name == "float16" and label.dtype.name == "int64"
        with pytest.raises(ConfigError, match=r"'1' float32 \(3, 4, 5\)"):
            loader.tf(dtype="float32", mean=0, std=1)
