"""The resolver: from ``Loader``'s options (``options.Options``) to what a loader is made of,
the :class:`Recipe` every worker and node receives and the :class:`RunSpec` the pool and the
nodes read, in :func:`resolve`, the one place a given value becomes a resolved one.

Each value is checked once, where it is resolved, with a message that says the fix: first the
values that need nothing else (the run and the cluster, the ranks, the image size and
channels, ``fast_decode``, ``mask_map``, the bad-sample budget, the split), then the source is
opened and what needs it is settled (the size and ``augment="auto"`` of decoded arrays, masks
against the aspect fit, the budget as a count). Nothing is started here (no worker, no shared
memory), so a wrong argument costs nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import batch as batch_mod
from .. import pixels as pixels_mod
from ..batchfn import BatchTransform
from ..decode.masks import MaskMap
from ..errors import ConfigError
from ..order import Plan
from ..recipe import Recipe
from ..schema import BatchSchema, Columns, SlotLayout, field_specs, leaves, resolve_form
from ..sources import open_source
from ..sources.base import Source, block_sizes
from ..transforms import PipelineSpec, check_mask_ops, pipeline_spec
from ..workers.address import reach as reach_cluster
from ..workers.clusteroptions import cluster_options
from ..workers.runspec import RunSpec
from . import config, ranks
from .options import ImageOptions, Options, OrderOptions, SourceOptions
from .selection import check_split, select


@dataclass(frozen=True)
class Settled:
    """The few values the loader itself reads (the workers never do), settled once."""

    #: ``augment=`` with "auto" settled against the source (shown by the loader).
    augment: Any
    #: The bad-sample budget as a count (the loader enforces it).
    max_errors: int


@dataclass(frozen=True)
class Resolved:
    """What ``Loader(**kwargs)`` is made of, before anything runs: the ``recipe`` every
    worker and node receives, the ``run`` spec the pool and the nodes read, what the loader
    itself reads (``settled``), and whether the rank is still to be read (``rank_pending``:
    no rank was given and no group found; read again when an epoch starts, ``ranks``). The
    loader takes each part into its own home: none is held twice."""

    recipe: Recipe
    run: RunSpec
    settled: Settled
    rank_pending: bool


@dataclass(frozen=True)
class _Image:
    """The image options resolved before the source is opened (None: the source's own)."""

    size: tuple[int, int] | None
    channels: int | None
    fast: bool | None
    mask_map: MaskMap | None


def resolve(opts: Options) -> Resolved:
    """The parts of ``Loader(**kwargs)``, from its grouped options."""
    run = run_spec(opts)
    if run.cluster is not None:  # a wrong address is found now, not at the first batch
        reach_cluster(run.cluster.address, run.cluster.connect_timeout)
    ranked = config.rank_world(opts.order.rank, opts.order.world_size)
    image = _given_image(opts.image)
    budget = config.max_errors(opts.run.max_errors)
    batch, subset = opts.batch, opts.source.subset
    source = open_selected(opts.source, opts.order.seed, _named(batch.batch, batch.batch_transform))
    has_masks = bool(source.has_masks)
    spec, augment = _pipeline(opts.image, image, source, subset)
    _check_masks(spec, has_masks, opts.image.mask_map)
    drop_last = batch.drop_last
    if drop_last is None:  # training drops the ragged batch; evaluation sees every sample
        drop_last = opts.order.shuffle and subset != "validation"
    plan = _plan(opts.order, source, batch.batch_size, drop_last, ranked)
    weight, fields = opts.source.sample_weight, opts.source.fields
    columns = Columns(batch_mod.columns(source, weight, fields, batch.label_mode))
    specs = field_specs(spec.size, spec.channels, has_masks, columns, source.sample_fields)
    batch_fn = None
    if batch.batch_transform is not None:  # probed here: the fields it leaves make the slot
        batch_fn = BatchTransform(batch.batch_transform, specs, batch.batch_size)
        specs = batch_fn.outputs
    layout = SlotLayout(batch.batch_size, specs)
    form = resolve_form(batch.batch, [f[0] for f in layout.fields], source.sample_form)
    given = opts.run
    reads = config.read_settings(
        given.read_ahead, given.page_cache, run.timeout, given.request_rate
    )
    schema = BatchSchema(layout, columns, form)
    return Resolved(
        recipe=Recipe(source, spec, plan, schema, reads, batch_fn),
        run=run,
        settled=Settled(augment, config.error_count(budget, len(source))),
        rank_pending=ranks.pending(opts.order.rank, opts.order.world_size, ranked),
    )


def run_spec(opts: Options) -> RunSpec:
    """The run half of the options, resolved: the worker count and why, the cluster."""
    run, ray = opts.run, opts.ray
    workers, reason = config.worker_count(run.workers)
    cluster = cluster_options(
        ray.cluster,
        ray.cluster_workers,
        ray.cluster_transport,
        ray.cluster_listen,
        ray.cluster_connect_timeout,
    )
    auto = isinstance(run.workers, str) and run.workers == "auto"
    return RunSpec.of(
        run, workers=workers, workers_reason=reason, auto_workers=auto, cluster=cluster
    )


def _given_image(image: ImageOptions) -> _Image:
    """The image options that need no source, checked and resolved."""
    mode = image.color_mode
    return _Image(
        size=config.image_size(image.image_size),
        channels=None if mode is None else pixels_mod.channels(mode, None),
        fast=config.fast_decode(image.fast_decode),
        mask_map=None if image.mask_map is None else MaskMap(image.mask_map),
    )


def _pipeline(
    opts: ImageOptions, image: _Image, source: Source, subset: Any
) -> tuple[PipelineSpec, Any]:
    """The decode + transform spec of the image options settled against ``source`` (every
    field of :class:`PipelineSpec` named as an image option is copied as given), and the
    settled ``augment``."""
    pixels = source.pixel_size()
    augment = config.augment(opts.augment, pixels, subset)
    crop, pad = opts.crop_to_aspect_ratio, opts.pad_to_aspect_ratio
    resolved: dict[str, Any] = {
        "channels": image.channels or pixels_mod.channels(None, source.pixel_channels()),
        "fast": config.fast_for(image.fast, augment),
        "fit": "crop" if crop else "pad" if pad else None,
        "mask_map": image.mask_map,
    }
    named = {f.name for f in dataclasses.fields(PipelineSpec)} - set(resolved)
    same = {n: getattr(opts, n) for n in named if n in ImageOptions.__dataclass_fields__}
    spec = pipeline_spec(augment, config.sized(image.size, pixels), **same, **resolved)
    return spec, augment


def _check_masks(spec: PipelineSpec, has_masks: bool, mask_map: Any) -> None:
    """Masks go with the spec's geometry: no black border, mask-aware ops; ``mask_map`` needs
    masks."""
    if has_masks and spec.fit == "pad":
        raise ConfigError(
            "pad_to_aspect_ratio=True with masks: the black border has no class to give the "
            "mask; use crop_to_aspect_ratio=True, or augment=None (a plain resize of both)"
        )
    if has_masks and spec.ops:
        check_mask_ops(list(spec.ops))
    if mask_map is not None and not has_masks:
        raise ConfigError(
            f"mask_map={mask_map!r} maps mask values, and this source has no masks; pass masks= "
            "(or a CSV with an image,mask header), or drop mask_map"
        )
    if has_masks and spec.post:
        check_mask_ops(spec.post)


def _named(form: Any, batch_transform: Any) -> tuple[str, ...] | None:
    """The fields ``batch=`` names, which are all a per-sample dataset's batch keeps (None:
    every field, for the default structure, ``"dict"``, or a ``batch_transform``, which
    reads them all)."""
    if form is None or form == "dict" or batch_transform is not None:
        return None
    return tuple(leaves(form))


def open_selected(opts: SourceOptions, seed: int, keep: tuple[str, ...] | None = None) -> Source:
    """The opened source, split (``validation_split``/``subset``) and its classes picked;
    ``keep``: the fields a per-sample dataset's batch holds (None: all)."""
    split = check_split(opts.validation_split, opts.subset)
    named = batch_mod.column_names(opts.sample_weight, opts.fields)
    opened = open_source(
        opts.source,
        paths=opts.paths,
        labels=opts.labels,
        masks=opts.masks,
        label_column=opts.label_column,
        columns=named,
        spec=opts.spec,
        settings=opts,
        keep=keep,
    )
    return select(
        opened,
        class_names=opts.class_names,
        validation_split=split,
        subset=opts.subset,
        seed=seed,
        stratify=opts.stratify,
        cut=opts.validation_cut,
    )


def _plan(
    opts: OrderOptions, source: Source, batch_size: int, drop_last: bool, ranked: tuple[int, int]
) -> Plan:
    """Which samples each batch of each epoch holds, for rank ``ranked[0]`` of ``ranked[1]``."""
    rank, world = ranked
    plan = Plan(
        len(source),
        batch_size,
        opts.seed,
        opts.shuffle,
        drop_last,
        rank,
        world,
        block_sizes=block_sizes(source),
        split=opts.rank_split,
    )
    return check_batches(plan)


def check_batches(plan: Plan) -> Plan:
    """``plan``, once it gives this rank at least one batch per epoch."""
    if plan.batches() == 0:
        ranks_note = f" on each of {plan.world_size} ranks" if plan.world_size > 1 else ""
        raise ConfigError(
            f"{plan.n} samples make no full batch of {plan.batch_size}{ranks_note} with "
            "drop_last=True: lower batch_size or pass drop_last=False"
        )
    return plan
