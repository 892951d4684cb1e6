"""One pipeline factory per peer; each pipeline yields uint8 (B, 224, 224, 3) batches.

All peers do the same work: read the file, decode the JPEG, RandomResizedCrop (scale 0.08-1,
ratio 3/4-4/3, 10 tries then a centre crop), resize to ``size`` x ``size``, random horizontal
flip, uint8 batches of ``batch_size`` (the ragged last batch dropped, like stoker's training
loaders), samples shuffled every epoch, ``workers`` parallel workers. Each yields batches in
the form the peer itself produces (numpy, tf.Tensor, torch.Tensor): no extra conversions.

    name               what
    stoker             stoker.Loader(workers=2) (for augment="train" that decodes with
                       libjpeg's fast IDCT and plain upsampling: fast_decode="auto")
    stoker-exact       stoker.Loader(workers=2, fast_decode=False): libjpeg's accurate decode
    tf-fused           tf.data: read_file -> extract_jpeg_shape + sample_distorted_bounding_box
                       -> decode_and_crop_jpeg -> resize -> random_flip -> uint8 -> batch
                       -> prefetch(AUTOTUNE), num_parallel_calls=2, TF intra/inter threads 2
    tf-plain           tf.data: read_file -> decode_jpeg -> slice(same box) -> resize -> ...
    torch-pillow       torch DataLoader(num_workers=2, persistent_workers=True), Dataset with
                       Pillow open + hand-written RandomResizedCrop (torchvision's algorithm and
                       Pillow ops: crop, resize BILINEAR, FLIP_LEFT_RIGHT) + np.asarray
    torch-simplejpeg   same DataLoader, simplejpeg decode + numpy crop + cv2.resize(INTER_LINEAR)
                       + flip (cv2.setNumThreads(1) in each worker, the usual advice)
    keras-pydataset    keras.utils.PyDataset(workers=2, use_multiprocessing=True) whose
                       __getitem__ builds a batch with keras.utils.load_img + the Pillow ops
                       above, iterated through Keras' own PyDatasetAdapter/OrderedEnqueuer
                       exactly as model.fit drives it (on_epoch_begin, iterator, on_epoch_end)

Use: ``p = make("tf-fused", items); for batch in p.epoch(): ...; p.close()``. Frameworks are
imported inside the factories, so importing this module is cheap. Where a work detail differs
from stoker it is noted: stoker resizes with INTER_AREA when the crop is shrunk more than 2x
(INTER_LINEAR otherwise); tf.data and cv2 peers always use plain bilinear (cheaper); Pillow's
BILINEAR filter antialiases (more expensive).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

Items = Sequence[tuple[str, int]]
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


class Pipeline:
    """A peer: ``epoch()`` gives one epoch of batches; ``close()`` stops its workers.

    ``stream`` (stoker only): a callable returning the loader's one endless batch stream and
    ``batches``: batches per epoch. stoker keeps prefetching across epochs, so
    `throughput.py compare` measures it on that stream (see `common.time_stream`) instead of
    per-epoch iterators.
    """

    def __init__(
        self,
        name: str,
        epoch: Callable[[], Iterator[Any]],
        close: Callable[[], None] = lambda: None,
        obj: Any = None,
        stream: Callable[[], Iterator[Any]] | None = None,
        batches: int = 0,
    ) -> None:
        self.name, self._epoch, self._close, self.obj = name, epoch, close, obj
        self.stream, self.batches = stream, batches
        self.closed = False

    def epoch(self) -> Iterator[Any]:
        return self._epoch()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- shared sample code


def rrc_box(width: int, height: int, rng: Any) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, written out: ``(left, top, w, h)``."""
    area = width * height
    lo, hi = math.log(RATIO[0]), math.log(RATIO[1])
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(lo, hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def pil_augment(img: Any, size: int, rng: Any) -> np.ndarray:
    """RandomResizedCrop + flip of an RGB PIL image, as torchvision does it on PIL images."""
    from PIL import Image

    left, top, w, h = rrc_box(img.width, img.height, rng)
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def pil_sample(path: str, size: int, rng: Any) -> np.ndarray:
    """torchvision's pil_loader (open, convert RGB) + `pil_augment`."""
    from PIL import Image

    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")
    return pil_augment(img, size, rng)


def cv_sample(path: str, size: int, rng: Any) -> np.ndarray:
    """simplejpeg full decode + numpy crop + cv2.resize (bilinear) + flip."""
    import cv2
    import simplejpeg

    with open(path, "rb") as f:
        img = simplejpeg.decode_jpeg(f.read(), colorspace="RGB")
    left, top, w, h = rrc_box(img.shape[1], img.shape[0], rng)
    out = cv2.resize(
        img[top : top + h, left : left + w], (size, size), interpolation=cv2.INTER_LINEAR
    )
    if rng.random() < 0.5:
        out = cv2.flip(out, 1)
    return out


# ---------------------------------------------------------------------------- stoker


def _stoker(
    items: Items, data: str | None, batch_size: int, size: int, workers: int, seed: int, exact: bool
) -> Pipeline:
    import stoker

    src: dict[str, Any] = (
        {"source": data}
        if data is not None
        else {"paths": [p for p, _ in items], "labels": [y for _, y in items]}
    )
    loader = stoker.Loader(
        **src,
        batch_size=batch_size,
        image_size=size,
        augment="train",
        workers=workers,
        seed=seed,
        shuffle=True,
        fast_decode=False if exact else "auto",
    )
    endless: list[Iterator[Any]] = []

    def stream() -> Iterator[Any]:
        if not endless:
            endless.append(loader.stream())
        return endless[0]

    return Pipeline(
        "stoker-exact" if exact else "stoker",
        lambda: iter(loader),
        loader.close,
        loader,
        stream,
        len(loader),
    )


# ---------------------------------------------------------------------------- tf.data


def _tf(
    items: Items,
    batch_size: int,
    size: int,
    workers: int,
    seed: int,
    fused: bool,
    autotune: bool = False,
) -> Pipeline:
    import tensorflow as tf

    try:  # must happen before TensorFlow's runtime starts; a fresh process is assumed
        tf.config.threading.set_intra_op_parallelism_threads(workers)
        tf.config.threading.set_inter_op_parallelism_threads(workers)
    except RuntimeError as exc:
        print(f"warning: could not limit TensorFlow threads ({exc})")
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, shape=[1, 1, 4])

    def box(shape: Any) -> tuple[Any, Any]:
        begin, extent, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=whole,
            min_object_covered=0.0,
            aspect_ratio_range=RATIO,
            area_range=SCALE,
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        return begin, extent

    def finish(img: Any) -> Any:
        img = tf.image.resize(img, [size, size], method="bilinear")
        img = tf.image.random_flip_left_right(img)
        return tf.cast(img, tf.uint8)

    def fused_fn(path: Any, label: Any) -> tuple[Any, Any]:
        data = tf.io.read_file(path)
        begin, extent = box(tf.image.extract_jpeg_shape(data))
        window = tf.stack([begin[0], begin[1], extent[0], extent[1]])
        img = tf.image.decode_and_crop_jpeg(data, window, channels=3)
        return finish(img), label

    def plain_fn(path: Any, label: Any) -> tuple[Any, Any]:
        img = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        begin, extent = box(tf.shape(img))
        return finish(tf.slice(img, begin, extent)), label

    paths = tf.constant([p for p, _ in items])
    labels = tf.constant([y for _, y in items], tf.int64)
    ds = (
        tf.data.Dataset.from_tensor_slices((paths, labels))
        .shuffle(len(items), seed=seed, reshuffle_each_iteration=True)
        .map(
            fused_fn if fused else plain_fn,
            num_parallel_calls=tf.data.AUTOTUNE if autotune else workers,
        )
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return Pipeline("tf-fused" if fused else "tf-plain", lambda: iter(ds), obj=ds)


# ---------------------------------------------------------------------------- PyTorch


class SampleDataset:
    """Map-style dataset (DataLoader needs only __len__/__getitem__): one augmented sample."""

    def __init__(self, items: Items, size: int, sample: Callable[..., np.ndarray]) -> None:
        self.items, self.size, self.sample = list(items), size, sample

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.items[index]
        # DataLoader seeds `random` differently in every worker and epoch (base_seed + id)
        return self.sample(path, self.size, random), label  # the module: its global Random


def _worker_init(_: int) -> None:
    """DataLoader worker setup: cv2 on one thread (the usual advice; helps the cv2 peer), and
    silence torch's one-time 'non-writable NumPy array' warning from collating np.asarray(PIL)."""
    import warnings

    import cv2

    cv2.setNumThreads(1)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _torch(
    items: Items, batch_size: int, size: int, workers: int, seed: int, decoder: str
) -> Pipeline:
    import torch
    from torch.utils.data import DataLoader

    sample = pil_sample if decoder == "pillow" else cv_sample
    loader = DataLoader(
        SampleDataset(items, size, sample),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=_worker_init,
    )

    def close() -> None:
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        loader._iterator = None

    return Pipeline(f"torch-{decoder}", lambda: iter(loader), close, loader)


# ---------------------------------------------------------------------------- Keras PyDataset


def _keras_dataset_class() -> type:
    """Build (once) the PyDataset class; a module attribute so it pickles by reference."""
    cls = globals().get("_LoadImgDataset")
    if cls is not None:
        return cls
    import keras

    class LoadImgDataset(keras.utils.PyDataset):
        """The usual hand-written PyDataset: a batch of load_img + augmentation per index."""

        def __init__(
            self, items: Items, batch_size: int, size: int, workers: int, seed: int
        ) -> None:
            super().__init__(workers=workers, use_multiprocessing=True)
            self.paths = [p for p, _ in items]
            self.labels = np.array([y for _, y in items], np.int64)
            self.batch_size, self.size, self.seed = batch_size, size, seed
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(len(items))
            self.epoch = 0

        def __len__(self) -> int:
            return len(self.paths) // self.batch_size

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            bs = self.batch_size
            ids = self.order[index * bs : (index + 1) * bs]
            # forked pool workers share numpy's global state: seed per (epoch, batch) instead
            rng = random.Random(self.seed * 1_000_003 + self.epoch * 10_007 + index)
            x = np.empty((len(ids), self.size, self.size, 3), np.uint8)
            for j, i in enumerate(ids):
                img = keras.utils.load_img(self.paths[i])  # PIL open + convert("RGB")
                x[j] = pil_augment(img, self.size, rng)
            return x, self.labels[ids]

        def on_epoch_end(self) -> None:
            self.epoch += 1
            self.order = self.rng.permutation(len(self.paths))

    LoadImgDataset.__module__ = __name__
    LoadImgDataset.__qualname__ = LoadImgDataset.__name__ = "_LoadImgDataset"
    globals()["_LoadImgDataset"] = LoadImgDataset
    return LoadImgDataset


def __getattr__(name: str) -> Any:  # PEP 562: lets pickle find the lazily built class
    if name == "_LoadImgDataset":
        return _keras_dataset_class()
    raise AttributeError(name)


def keras_pydataset(
    items: Items, batch_size: int = 256, size: int = 224, workers: int = 2, seed: int = 0
) -> Any:
    """The Keras peer's PyDataset itself (for model.fit in `training.py keras-fit`)."""
    return _keras_dataset_class()(items, batch_size, size, workers, seed)


def _keras(items: Items, batch_size: int, size: int, workers: int, seed: int) -> Pipeline:
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    ds = keras_pydataset(items, batch_size, size, workers, seed)
    adapter = PyDatasetAdapter(ds, shuffle=True)  # what model.fit(shuffle=True) builds

    def epoch() -> Iterator[Any]:
        adapter.on_epoch_begin()
        try:
            yield from adapter.get_numpy_iterator()
        finally:
            adapter.on_epoch_end()

    def close() -> None:
        if adapter.enqueuer is not None:
            adapter.enqueuer.stop()

    return Pipeline("keras-pydataset", epoch, close, ds)


# ---------------------------------------------------------------------------- registry

PEERS = tuple(
    "stoker stoker-exact tf-fused tf-plain torch-pillow torch-simplejpeg keras-pydataset".split()
)


def make(
    name: str,
    items: Items,
    *,
    data: str | None = None,
    batch_size: int = 256,
    size: int = 224,
    workers: int = 2,
    seed: int = 0,
    autotune: bool = False,
) -> Pipeline:
    """Build peer ``name`` over ``items`` (``(path, label)`` pairs).

    ``data``: the ImageFolder directory the items came from, when they are all of it; stoker
    then opens the folder itself (its normal use) instead of a path list. ``autotune``: tf.data
    peers map with ``num_parallel_calls=AUTOTUNE`` instead of ``workers`` (`storage.py cold`).
    """
    if name in ("stoker", "stoker-exact"):
        return _stoker(items, data, batch_size, size, workers, seed, name == "stoker-exact")
    if name in ("tf-fused", "tf-plain"):
        return _tf(items, batch_size, size, workers, seed, name == "tf-fused", autotune)
    if name in ("torch-pillow", "torch-simplejpeg"):
        return _torch(items, batch_size, size, workers, seed, name.split("-")[1])
    if name == "keras-pydataset":
        return _keras(items, batch_size, size, workers, seed)
    raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")
