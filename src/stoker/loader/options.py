"""The Loader's options: every argument declared once, in a few frozen groups.

Each field of a group is one ``Loader`` argument: its type (the field's annotation, the one
type the signature, the docs and type checkers show), its default, one line of meaning and its
check (``name: type = option(default, doc, check=...)``). ``parse`` checks each argument that
is taken as given; one that is resolved (against the opened source or another argument:
``image_size``, ``color_mode``, ``fast_decode``, ``mask_map``, ``max_errors``, the split, the
ranks, the cluster) has no check here and is checked once, where ``wiring.resolve`` resolves
it, still before a file is opened or anything started. ``help(stoker.Loader)``, its
``inspect.signature``, the docs' options page and the ``LoaderKwargs`` of type checkers
(``scripts/gen_options.py`` writes ``docs/options.md`` and ``kwargs.py``) are all generated
from the groups (by ``optiondocs``), and ``tests/test_options.py`` fails while they disagree.
The field machinery (``option``, the check adapters, ``make_group``) is ``optionfield``.

The groups follow the data: ``source`` (what to load, which samples: read by the source readers
and the split), ``image`` (how each image is decoded and shaped: the pipeline), ``batch`` (what a
batch holds: the slot layout and its structure), ``order`` (which samples each batch of an epoch
holds: the plan), ``run`` (how the work runs: workers, prefetch, reads, budgets) and ``ray``
(decoding on other nodes). A group is handed whole to the code that reads it.

Adding an argument: one field in its group (type, default, doc, check), a field of the same
name in the spec that carries it (``PipelineSpec`` for an image option, ``RunSpec`` for a run
option: ``wiring.resolve`` copies it by name), the line that reads it there, then
``python scripts/gen_options.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import Field, dataclass, fields
from os import PathLike
from typing import Any, Protocol

import numpy as np

from .. import pixels
from ..errors import ConfigError
from . import address, config
from .config import DEFAULT_MAX_PIXELS, DEFAULT_RATE
from .optionfield import flag, flag_or_none, make_group, of_value, option, storage_options
from .selection import check_cut


class Dataset(Protocol):
    """``Loader(dataset)``: any object with ``__len__`` and ``__getitem__`` (a sample: an
    image, a tuple or a dict of fields)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...


@dataclass(frozen=True)
class SourceOptions:
    """What to load and which of its samples: read by the source readers and the split."""

    source: str | PathLike[str] | np.ndarray | Dataset | None = option(
        None,
        "Where the samples are: an ImageFolder, a CSV/TSV, a `.npy`, an HDF5 file, a folder of "
        "Parquet or tar shards, a remote URL, a `(N, H, W, C)` uint8 array, or any object with "
        "`__len__` and `__getitem__`. Omit it with `paths=`.",
    )
    paths: list[str] | None = option(
        None,
        "Image file paths, instead of `source`; labels from `labels=`, masks from `masks=`.",
    )
    labels: np.ndarray | str | list[Any] | None = option(
        None,
        "Targets for arrays, `.npy` and `paths=`: any numeric array `(N, ...)` (kept exactly), a "
        "`.npy` path, or class names; none gives -1.",
    )
    masks: np.ndarray | list[str] | None = option(
        None,
        "Segmentation masks, one per image (`(N, H, W)` uint8 or mask files): batches become "
        "`(images, masks)`, with the image's crop and flip.",
    )
    label_column: str | list[str] | None = option(
        None,
        "CSV/TSV and Parquet: the target column(s) by name (a list of numeric columns gives `(N, "
        "K)`); `None` reads `label`.",
    )
    sample_weight: np.ndarray | str | None = option(
        None,
        "Per-sample weights (N numbers, or a CSV column name): batches become `(x, y, weight)`, "
        "weights float32.",
    )
    fields: dict[str, np.ndarray | str] | None = option(
        None,
        "Extra per-sample arrays `(N, ...)` (or CSV column names) by name, for `batch=`; dtype "
        "and shape kept.",
    )
    spec: dict[str, Any] | None = option(
        None,
        "For `Loader(dataset)`: the fields' `{name: (shape, dtype)}`, instead of probing "
        "`dataset[0]`.",
    )
    validation_split: float | None = option(
        None,
        "The fraction held out for validation, cut from a seeded permutation (needs `subset=`).",
    )
    subset: str | None = option(
        None,
        '`"training"`, `"validation"`, or `"both"` (returns a `(training, validation)` pair of '
        "loaders).",
    )
    stratify: bool = option(
        False,
        "With `validation_split`, split each class in the same proportion.",
        check=flag,
    )
    validation_cut: str = option(
        "random",
        'How `validation_split` cuts: `"random"` a seeded permutation (Keras\' '
        '`image_dataset_from_directory`), `"last"` the last fraction in order, unshuffled '
        "(Keras' `fit(validation_split=)` on arrays).",
        check=of_value(check_cut),
    )
    class_names: list[str] | None = option(
        None,
        "Keep only these classes; class `k` is `class_names[k]`.",
    )
    follow_links: bool = option(
        True,
        "Image folders: follow symbolic links to class folders, subfolders and files (each real "
        "folder walked once, a loop skipped with a warning); `False` skips every link, as "
        "Keras' `follow_links=False` skips linked folders.",
        check=flag,
    )
    storage_options: dict[str, Any] | None = option(
        None,
        "Buckets and URLs (`s3://`, `gs://`, `https://`, any fsspec URL): options for the "
        "filesystem, passed through unchanged (`endpoint_url`, `anon`, `profile`, keys); "
        "credentials otherwise come from the library's own chain, and never appear in a "
        "message, `stats()` or `state_dict()`.",
        check=of_value(storage_options),
    )
    listing_ttl: float = option(
        600.0,
        "Buckets: seconds a cached listing of a prefix is used without listing again (objects "
        "added within it are not seen until it expires); `0` lists at every Loader.",
        check=of_value(config.listing_ttl),
    )

    def __post_init__(self) -> None:
        check_cut(self.validation_cut, self.stratify)


@dataclass(frozen=True)
class ImageOptions:
    """How each image is decoded and shaped: read by the decode + transform pipeline."""

    image_size: int | tuple[int, int] | None = option(
        None,
        "Every batch's `(height, width)` (an int for a square); `None` is the arrays' own size "
        "for decoded arrays, 224 for image files.",
    )
    augment: str | Callable[..., Any] | list[Any] | dict[str, Any] | None = option(
        "auto",
        '`"train"` (random resized crop + flip: wrong for targets tied to pixel positions), '
        '`"eval"` (resize, centre crop), `None` (plain resize), a callable `(image, rng) -> '
        "image` (with masks `(image, mask, rng) -> (image, mask)`), a list of `stoker.ops`, a "
        'stock name then ops (`["train", stoker.ops.TrivialAugmentWide()]`: the ops run on the '
        "fused pipeline's output, see [Augmentation ops](augment-ops.md)), or a dict per half "
        'with `subset="both"`; `"auto"` is `"train"` for image files (`"eval"` for validation), '
        "`None` for arrays.",
    )
    color_mode: str | None = option(
        None,
        '`"grayscale"`, `"rgb"` or `"rgba"`: 1, 3 or 4 channels; `None` is 3 for image files, '
        "and decoded arrays keep their own.",
    )
    interpolation: str = option(
        "auto",
        'Resize filter: `"bilinear"`, `"area"`, `"bicubic"`, `"nearest"`; `"auto"` is bilinear, '
        "area past a 2x shrink.",
        check=of_value(pixels.interpolation),
    )
    crop_to_aspect_ratio: bool = option(
        False,
        "With `augment=None`: crop the centred window of the target aspect (the only part "
        "decoded) before resizing.",
        check=flag,
    )
    pad_to_aspect_ratio: bool = option(
        False,
        "With `augment=None`: resize the whole image into the middle of the target, black "
        "borders, placed exactly as Keras places it (`tf.image.resize_with_pad`); not with "
        "masks.",
        check=flag,
    )
    mask_map: dict[int, int] | int | None = option(
        None,
        "Remap mask values: a dict `{stored: wanted}` (others kept), or an int offset in "
        "-255..255 (`-1`: 1..3 -> 0..2); a value mapped outside 0-255 makes its mask a bad "
        "sample.",
    )
    max_pixels: int = option(
        DEFAULT_MAX_PIXELS,
        "Larger images are refused from their header (decompression bombs).",
        check=config.positive_int,
    )
    fast_decode: bool | str = option(
        "auto",
        "libjpeg's fast integer IDCT (a level or two off on a few pixels, a little faster); "
        '`"auto"` uses it for `augment="train"` only.',
    )
    strict_decode: bool = option(
        False,
        "Count a file that decodes only with libjpeg's warnings (recoverable corrupt data) as a "
        "bad file, whatever part of it a crop decodes (see [decoding](decoding.md)).",
        check=flag,
    )

    def __post_init__(self) -> None:
        if self.crop_to_aspect_ratio and self.pad_to_aspect_ratio:
            raise ConfigError(
                "pass crop_to_aspect_ratio=True or pad_to_aspect_ratio=True, not both"
            )


@dataclass(frozen=True)
class BatchOptions:
    """What a batch holds and how it is arranged: the slot layout and the batch's structure."""

    batch_size: int = option(
        64,
        "Samples per batch.",
        check=config.positive_int,
    )
    drop_last: bool | None = option(
        None,
        "Drop the ragged last batch so every batch has one shape; `None` is `shuffle` (False for "
        '`subset="validation"`).',
        check=flag_or_none,
    )
    label_mode: str | None = option(
        "auto",
        '`"int"`, `"categorical"`, `"binary"` or `None`, as in Keras; `"auto"` keeps the labels '
        "as the source holds them.",
    )
    batch: str | tuple[Any, ...] | dict[str, Any] | None = option(
        None,
        'The batch\'s structure: `None` the default tuple, `"dict"` every field by name, or a '
        "tuple/dict of field names (`image`, `label`, `mask`, `weight`, `index`, `path`, your "
        "`fields`).",
    )
    batch_transform: Callable[..., Any] | dict[str, Any] | None = option(
        None,
        "A function `(batch, rng)` on the whole batch as a dict of fields, run in the workers "
        "(mixup, cutmix): it changes the batch in place or returns a dict of fields; `rng` comes "
        'from `(seed, epoch, global step)`. A dict per half with `subset="both"`.',
    )


@dataclass(frozen=True)
class OrderOptions:
    """Which samples each batch of each epoch holds, on this rank: read by the plan."""

    shuffle: bool = option(
        True,
        "Shuffle the order every epoch.",
        check=flag,
    )
    seed: int = option(
        0,
        "The order, the splits and every random choice are a pure function of `(seed, epoch)`, "
        "whatever the worker count.",
        check=of_value(config.seed),
    )
    rank: int | None = option(
        None,
        "This process's rank; `None` reads the process group (`torch.distributed`, "
        "`jax.distributed`, Ray Train) when made and again when an epoch starts, until one of "
        "several ranks is found; else 0.",
    )
    world_size: int | None = option(
        None,
        "The number of ranks; `None` reads it with `rank`, else 1.",
    )
    rank_split: str = option(
        "pad",
        'How ranks split an epoch: `"pad"` or `"drop"` to equal counts (as '
        '`DistributedSampler`; "pad" is the one to gather evaluation over, keeping each `index` '
        'once), `"once"`: every sample on exactly one rank (counts differ: no per-batch gather).',
        check=of_value(config.check_rank_split),
    )
    skip: dict[int, list[tuple[int, int]]] | None = option(
        None,
        "Global steps to leave out, `{epoch: [(start, stop), ...]}` (stop excluded): iteration "
        "passes over them, every other batch stays the same, and `state_dict()` keeps them "
        "(also `loader.skip()`; see docs/resume.md).",
        check=of_value(address.check_skip),
    )
    exclude: list[int | str] | None = option(
        None,
        "Samples to leave out of every epoch, by source index or path; the others keep their "
        "relative order (also `loader.exclude()`; see docs/resume.md).",
        check=of_value(address.check_exclude),
    )


@dataclass(frozen=True)
class RunOptions:
    """How the work runs: worker processes, prefetch, reads, the bad-sample budget, time."""

    workers: int | str = option(
        "auto",
        'Worker processes; 0 loads in the calling process; `"auto"` is one per usable core (on a '
        "host with more than 8, one core in 8 is left to the training process, and at most 32), "
        "or 0 when a batch is too little work to pay for processes.",
        check=of_value(config.check_workers),
    )
    worker_threads: int | None = option(
        1,
        "Threads per pool (torch, OpenMP/BLAS, OpenCV, TensorFlow, XLA) in each worker, set "
        "before your code runs; `None` leaves each library's own default.",
        check=of_value(config.worker_threads),
    )
    prefetch: int | str = option(
        "auto",
        'Batches in flight; `"auto"` starts at 1 per worker and deepens to 2 when the workers '
        "are measured waiting while the training loop waited.",
        check=of_value(config.prefetch_arg),
    )
    max_errors: int | float = option(
        0.001,
        "Bad samples allowed (a count, or a fraction of the dataset rounded up), each named and "
        "replaced by the next good one; past it, `TooManyErrors`.",
    )
    timeout: float = option(
        300.0,
        "Seconds without progress before `WorkerHung`; a single read taking a quarter of it (at "
        "most 60 s) is a bad sample.",
        check=of_value(config.timeout),
    )
    start_method: str | None = option(
        None,
        'Deprecated, removed in 0.3: `"spawn"` is the only start method (each worker is a fresh '
        "interpreter, no `__main__` guard needed); leave it out.",
        check=of_value(config.start_method),
    )
    read_ahead: int | str = option(
        "auto",
        'Reads in flight per worker ahead of decoding; `"auto"` reads ahead only when reads are '
        "slow next to decoding; 0 never.",
        check=of_value(config.check_read_ahead),
    )
    page_cache: str = option(
        "auto",
        '`"auto"` reads around the page cache once the dataset is seen not to fit in RAM; '
        '`"keep"` never, `"drop"` always.',
        check=of_value(config.check_page_cache),
    )
    request_rate: float = option(
        DEFAULT_RATE,
        "Most requests per second to one prefix of an object store (`s3://`, `gs://`), shared "
        "by the loader's worker processes (each cluster node has its own); the default stays "
        "below S3's ~5,500/s and GCS's ~5,000/s.",
        check=of_value(config.request_rate),
    )


@dataclass(frozen=True)
class RayOptions:
    """Decoding on the nodes of a Ray cluster as well as here."""

    cluster: str | None = option(
        None,
        'Decode on the nodes of a Ray cluster as well (see [cluster](cluster.md)): `"ray"` joins '
        'the cluster this process joined (else `address="auto"`), or give a Ray address; batches '
        "are the same bytes as on one machine.",
    )
    cluster_workers: int | str = option(
        "auto",
        'With `cluster`: CPU cores to use on the nodes other than the trainer\'s; `"auto"` is '
        "all of them.",
    )
    cluster_transport: str = option(
        "tcp",
        'With `cluster`: `"tcp"` streams each batch over an authenticated connection straight '
        "into the ring, `\"object_store\"` goes through Ray's object store (only Ray's ports "
        "open); a node whose connection fails uses the object store.",
    )
    cluster_listen: str | None = option(
        None,
        "With `cluster`: the address this trainer listens on for its nodes' connections; `None` "
        "is its Ray node IP.",
    )
    cluster_connect_timeout: float | None = option(
        None,
        "With `cluster`: seconds the cluster's address has to answer when the Loader is made, "
        "else a `ClusterError`; `None` is 5.",
    )


#: The groups in the order the signature, ``help()`` and the docs page list them.
GROUPS: tuple[tuple[str, type], ...] = (
    ("source", SourceOptions),
    ("image", ImageOptions),
    ("batch", BatchOptions),
    ("order", OrderOptions),
    ("run", RunOptions),
    ("ray", RayOptions),
)


@dataclass(frozen=True)
class Options:
    """Every ``Loader`` argument as given, in its group: ``opts.image.color_mode``."""

    source: SourceOptions
    image: ImageOptions
    batch: BatchOptions
    order: OrderOptions
    run: RunOptions
    ray: RayOptions

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Options:
        """Check every argument taken as given and group them (the resolved ones are checked
        by ``wiring.resolve``); an unknown name is a TypeError, as for any Python function."""
        known = {f.name for _, f in entries()}
        for name in kwargs:
            if name not in known:
                raise TypeError(f"Loader() got an unexpected keyword argument {name!r}")
        groups = {key: make_group(group, kwargs) for key, group in GROUPS}
        return cls(**groups)

    def kwargs(self) -> dict[str, Any]:
        """The arguments as keywords again (``Loader(**opts.kwargs())`` is the same loader)."""
        return {f.name: getattr(getattr(self, key), f.name) for key, f in entries()}


def parse(**kwargs: Any) -> Options:
    """``Options.from_kwargs``: every ``Loader`` argument grouped, those taken as given
    checked."""
    return Options.from_kwargs(**kwargs)


def entries() -> Iterator[tuple[str, Field[Any]]]:
    """``(group key, field)`` of every argument, in the signature's order."""
    for key, group in GROUPS:
        for f in fields(group):
            yield key, f
