"""The one description of every ``Loader`` argument: its type and meaning, one line each.

``help(stoker.Loader)`` (the "Args" section of ``Loader.__doc__``) and the docs' options page
(``scripts/gen_options.py`` writes ``docs/options.md``) are both generated from ``OPTIONS``;
the defaults come from ``Loader.__init__``'s signature, never from here. ``tests/test_options.py``
fails while an argument has no entry, an entry names no argument, or the page is out of date.

Adding an argument: one ``Option(name, type, doc)`` line below, in the signature's order, then
``python scripts/gen_options.py``.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """One ``Loader`` argument: its name, its type as a user writes it, one line of meaning."""

    name: str
    type: str
    doc: str


OPTIONS: tuple[Option, ...] = (
    # what to load
    Option(
        "source",
        "str | PathLike | ndarray | dataset",
        "Where the samples are: an ImageFolder, a CSV/TSV, a `.npy`, an HDF5 file, a folder "
        "of Parquet or tar shards, a remote URL, a `(N, H, W, C)` uint8 array, or any object "
        "with `__len__` and `__getitem__`. Omit it with `paths=`.",
    ),
    Option(
        "paths",
        "list[str] | None",
        "Image file paths, instead of `source`; labels from `labels=`, masks from `masks=`.",
    ),
    Option(
        "labels",
        "array | str | list | None",
        "Targets for arrays, `.npy` and `paths=`: any numeric array `(N, ...)` (kept exactly), "
        "a `.npy` path, or class names; none gives -1.",
    ),
    Option(
        "masks",
        "array | list[str] | None",
        "Segmentation masks, one per image (`(N, H, W)` uint8 or mask files): batches become "
        "`(images, masks)`, with the image's crop and flip.",
    ),
    Option(
        "mask_map",
        "dict[int, int] | int | None",
        "Remap mask values: a dict `{stored: wanted}` (others kept), or an int offset (`-1`: "
        "1..3 -> 0..2); a value mapped outside 0-255 makes its mask a bad sample.",
    ),
    Option(
        "label_column",
        "str | list[str] | None",
        "CSV/TSV and Parquet: the target column(s) by name (a list of numeric columns gives "
        "`(N, K)`); `None` reads `label`.",
    ),
    Option(
        "sample_weight",
        "array | str | None",
        "Per-sample weights (N numbers, or a CSV column name): batches become "
        "`(x, y, weight)`, weights float32.",
    ),
    Option(
        "fields",
        "dict[str, array | str] | None",
        "Extra per-sample arrays `(N, ...)` (or CSV column names) by name, for `batch=`; "
        "dtype and shape kept.",
    ),
    # which samples
    Option(
        "validation_split",
        "float | None",
        "The fraction held out for validation, cut from a seeded permutation (needs `subset=`).",
    ),
    Option(
        "subset",
        "str | None",
        '`"training"`, `"validation"`, or `"both"` (returns a `(training, validation)` '
        "pair of loaders).",
    ),
    Option("stratify", "bool", "With `validation_split`, split each class in the same proportion."),
    Option(
        "label_mode",
        "str | None",
        '`"int"`, `"categorical"`, `"binary"` or `None`, as in Keras; `"auto"` keeps '
        "the labels as the source holds them.",
    ),
    Option(
        "class_names", "list[str] | None", "Keep only these classes; class `k` is `class_names[k]`."
    ),
    # how images are decoded and shaped
    Option(
        "color_mode",
        "str | None",
        '`"grayscale"`, `"rgb"` or `"rgba"`: 1, 3 or 4 channels; `None` is 3 for image '
        "files, and decoded arrays keep their own.",
    ),
    Option(
        "interpolation",
        "str",
        'Resize filter: `"bilinear"`, `"area"`, `"bicubic"`, `"nearest"`; `"auto"` '
        "is bilinear, area past a 2x shrink.",
    ),
    Option(
        "crop_to_aspect_ratio",
        "bool",
        "With `augment=None`: crop the centred window of the target aspect (the only part "
        "decoded) before resizing.",
    ),
    Option(
        "pad_to_aspect_ratio",
        "bool",
        "With `augment=None`: resize the whole image into the middle of the target, black "
        "borders, placed exactly as Keras places it (`tf.image.resize_with_pad`); not with "
        "masks.",
    ),
    Option("batch_size", "int", "Samples per batch."),
    Option(
        "image_size",
        "int | tuple[int, int] | None",
        "Every batch's `(height, width)` (an int for a square); `None` is the arrays' own size "
        "for decoded arrays, 224 for image files.",
    ),
    Option(
        "augment",
        "str | callable | list | dict | None",
        '`"train"` (random resized crop + flip: wrong for targets tied to pixel positions), '
        '`"eval"` (resize, centre crop), `None` (plain resize), a callable '
        "`(image, rng) -> image` (with masks `(image, mask, rng) -> (image, mask)`), a list "
        "of `stoker.ops`, a stock name then ops "
        '(`["train", stoker.ops.TrivialAugmentWide()]`: the ops run on the fused '
        "pipeline's output, see [Augmentation ops](augment-ops.md)), or a dict per half with "
        '`subset="both"`; `"auto"` is `"train"` for image files (`"eval"` for '
        "validation), `None` for arrays.",
    ),
    # order and randomness
    Option("shuffle", "bool", "Shuffle the order every epoch."),
    Option(
        "seed",
        "int",
        "The order, the splits and every random choice are a pure function of "
        "`(seed, epoch)`, whatever the worker count.",
    ),
    # how it runs
    Option(
        "workers",
        "int | str",
        'Worker processes; 0 loads in the calling process; `"auto"` is one per usable core '
        "(on a host with more than 8, one core in 8 is left to the training process, and at "
        "most 32), or 0 when a batch is too little work to pay for processes.",
    ),
    Option(
        "worker_threads",
        "int | None",
        "Threads per pool (torch, OpenMP/BLAS, OpenCV, TensorFlow, XLA) in each worker, set "
        "before your code runs; `None` leaves each library's own default.",
    ),
    Option(
        "drop_last",
        "bool | None",
        "Drop the ragged last batch so every batch has one shape; `None` is `shuffle` (False "
        'for `subset="validation"`).',
    ),
    Option(
        "prefetch",
        "int | str",
        'Batches in flight; `"auto"` starts at 1 per worker and deepens to 2 when the '
        "workers are measured waiting while the training loop waited.",
    ),
    Option(
        "max_errors",
        "int | float",
        "Bad samples allowed (a count, or a fraction of the dataset rounded up), each named "
        "and replaced by the next good one; past it, `TooManyErrors`.",
    ),
    Option(
        "max_pixels", "int", "Larger images are refused from their header (decompression bombs)."
    ),
    Option(
        "fast_decode",
        "bool | str",
        "libjpeg's fast integer IDCT (a level or two off on a few pixels, a little faster); "
        '`"auto"` uses it for `augment="train"` only.',
    ),
    Option(
        "strict_decode",
        "bool",
        "Count a file that decodes only with libjpeg's warnings (recoverable corrupt data) "
        "as a bad file, whatever part of it a crop decodes (see [decoding](decoding.md)).",
    ),
    Option(
        "timeout",
        "float",
        "Seconds without progress before `WorkerHung`; a single read taking a quarter of it "
        "(at most 60 s) is a bad sample.",
    ),
    # distributed
    Option(
        "rank",
        "int | None",
        "This process's rank; `None` reads `torch.distributed` when it is initialised, else 0.",
    ),
    Option(
        "world_size", "int | None", "The number of ranks; `None` reads `torch.distributed`, else 1."
    ),
    Option(
        "rank_split",
        "str",
        'How ranks split an epoch: `"pad"` or `"drop"` to equal counts (as '
        '`DistributedSampler`), `"once"`: every sample on exactly one rank.',
    ),
    Option(
        "start_method",
        "str",
        '`"spawn"`, the only one: each worker is a fresh interpreter (no `__main__` guard needed).',
    ),
    # what a batch is
    Option(
        "batch",
        "str | tuple | dict | None",
        'The batch\'s structure: `None` the default tuple, `"dict"` every field by name, or a '
        "tuple/dict of field names (`image`, `label`, `mask`, `weight`, `index`, `path`, "
        "your `fields`).",
    ),
    Option(
        "batch_transform",
        "callable | dict | None",
        "A function `(batch, rng)` on the whole batch as a dict of fields, run in the workers "
        "(mixup, cutmix): it changes the batch in place or returns a dict of fields; `rng` "
        'comes from `(seed, epoch, rank, batch)`. A dict per half with `subset="both"`.',
    ),
    # reading
    Option(
        "read_ahead",
        "int | str",
        'Reads in flight per worker ahead of decoding; `"auto"` reads ahead only when reads '
        "are slow next to decoding; 0 never.",
    ),
    Option(
        "page_cache",
        "str",
        '`"auto"` reads around the page cache once the dataset is seen not to fit in RAM; '
        '`"keep"` never, `"drop"` always.',
    ),
    Option(
        "spec",
        "dict | None",
        "For `Loader(dataset)`: the fields' `{name: (shape, dtype)}`, instead of probing "
        "`dataset[0]`.",
    ),
    # past one machine
    Option(
        "cluster",
        "str | None",
        'Decode on the nodes of a Ray cluster as well (see [cluster](cluster.md)): `"ray"` '
        'joins the cluster this process joined (else `address="auto"`), or give a Ray '
        "address; batches are the same bytes as on one machine.",
    ),
    Option(
        "cluster_workers",
        "int | str",
        'With `cluster`: CPU cores to use on the nodes other than the trainer\'s; `"auto"` '
        "is all of them.",
    ),
    Option(
        "cluster_transport",
        "str",
        'With `cluster`: `"tcp"` streams each batch over an authenticated connection '
        'straight into the ring, `"object_store"` goes through Ray\'s object store (only '
        "Ray's ports open); a node whose connection fails uses the object store.",
    ),
    Option(
        "cluster_listen",
        "str | None",
        "With `cluster`: the address this trainer listens on for its nodes' connections; "
        "`None` is its Ray node IP.",
    ),
)


def by_name() -> dict[str, Option]:
    """``OPTIONS`` keyed by argument name."""
    return {o.name: o for o in OPTIONS}


def arguments(init: Callable[..., Any]) -> list[inspect.Parameter]:
    """The keyword arguments of ``init`` (``Loader.__init__``), ``self`` left out."""
    return [p for p in inspect.signature(init).parameters.values() if p.name != "self"]


def default_text(param: inspect.Parameter) -> str:
    """A parameter's default as a user would write it."""
    value = param.default
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:_}"
    return repr(value)


def _documented(params: Iterable[inspect.Parameter]) -> list[tuple[inspect.Parameter, Option]]:
    table = by_name()
    return [(p, table[p.name]) for p in params if p.name in table]


def args_section(init: Callable[..., Any]) -> str:
    """The Google-style "Args:" section of ``Loader.__doc__`` (indented for a class body)."""
    lines = ["Args:"]
    for param, option in _documented(arguments(init)):
        entry = f"{param.name} ({option.type}): {option.doc} Default: `{default_text(param)}`."
        lines.append(
            textwrap.fill(
                entry,
                width=92,
                initial_indent="    ",
                subsequent_indent="        ",
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)


def markdown_page(init: Callable[..., Any]) -> str:
    """``docs/options.md``: every argument with its type, default and meaning."""
    head = (
        "# Options\n\n"
        "<!-- Generated by scripts/gen_options.py from src/stoker/loader/options.py: edit that "
        "file, then run the script. -->\n\n"
        "Every argument of `stoker.Loader` (all keyword-only but `source`), as "
        "`help(stoker.Loader)` shows them. The pages linked from each topic say more: "
        "[datasets and batches](batches.md), [performance](performance.md), "
        "[distributed](distributed.md).\n\n"
        "| argument | type | default | meaning |\n| --- | --- | --- | --- |\n"
    )
    rows = [
        f"| `{p.name}` | `{_cell(o.type)}` | `{default_text(p)}` | {_cell(o.doc)} |"
        for p, o in _documented(arguments(init))
    ]
    return head + "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|")
