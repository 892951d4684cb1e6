"""From ``Loader``'s checked options (``options.Options``) to the parts it wires together: the
source (opened, split, its classes picked), the decode pipeline, the epoch plan, the batch's
schema.

Every argument was checked on its own before this (``Options.from_kwargs``); what needs the
opened source is decided here (the image size and ``augment="auto"`` of decoded arrays, masks
against the aspect fit, the bad-sample budget as a count), each with a message that says the
fix. Nothing is started here (no worker, no shared memory), so a wrong argument costs nothing.
"""

from __future__ import annotations

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
from ..transforms import CustomPipeline, check_mask_ops, image_pipeline
from . import config, ranks
from .options import ImageOptions, Options, OrderOptions, SourceOptions
from .selection import check_split, select


@dataclass
class Parts:
    """What a Loader is made of, before anything runs: the ``recipe`` every worker and node
    receives, and what the loader itself settled from the source (shown, or used here)."""

    recipe: Recipe
    image_size: tuple[int, int]
    augment: Any
    has_masks: bool
    drop_last: bool
    max_errors: int
    #: No rank was given and no group found: read again when an epoch starts (``ranks``).
    rank_pending: bool


def build(opts: Options) -> Parts:
    """The parts for ``Loader(**kwargs)``, from its checked options."""
    image, batch, subset = opts.image, opts.batch, opts.source.subset
    source = open_selected(opts.source, opts.order.seed, _named(batch.batch, batch.batch_transform))
    pixels = source.pixel_size()
    image_size = config.image_size(image.image_size, pixels)
    augment = config.augment(image.augment, pixels, subset)
    pipeline = _pipeline(image, source, image_size, augment)
    has_masks = bool(source.has_masks)
    if has_masks and image.pad_to_aspect_ratio:
        raise ConfigError(
            "pad_to_aspect_ratio=True with masks: the black border has no class to give the "
            "mask; use crop_to_aspect_ratio=True, or augment=None (a plain resize of both)"
        )
    if has_masks and isinstance(pipeline, CustomPipeline):
        check_mask_ops(pipeline.ops)
    pipeline.mask_map = _mask_map(image.mask_map, has_masks)
    if has_masks and pipeline.post:
        check_mask_ops(pipeline.post)
    drop_last = batch.drop_last
    if drop_last is None:  # training drops the ragged batch; evaluation sees every sample
        drop_last = opts.order.shuffle and subset != "validation"
    max_errors = config.max_errors(opts.run.max_errors, len(source))
    rank, world = config.rank_world(opts.order.rank, opts.order.world_size)
    plan = _plan(opts.order, source, batch.batch_size, drop_last, (rank, world))
    weight, fields = opts.source.sample_weight, opts.source.fields
    columns = Columns(batch_mod.columns(source, weight, fields, batch.label_mode))
    specs = field_specs(image_size, pipeline.channels, has_masks, columns, source.sample_fields)
    batch_fn = None
    if batch.batch_transform is not None:  # probed here: the fields it leaves make the slot
        batch_fn = BatchTransform(batch.batch_transform, specs, batch.batch_size)
        specs = batch_fn.outputs
    layout = SlotLayout(batch.batch_size, specs)
    form = resolve_form(batch.batch, [f[0] for f in layout.fields], source.sample_form)
    run = opts.run
    reads = config.read_settings(run.read_ahead, run.page_cache, run.timeout, run.request_rate)
    schema = BatchSchema(layout, columns, form)
    return Parts(
        recipe=Recipe(source, pipeline, plan, schema, reads, batch_fn),
        image_size=image_size,
        augment=augment,
        has_masks=has_masks,
        drop_last=drop_last,
        max_errors=max_errors,
        rank_pending=ranks.pending(opts.order.rank, opts.order.world_size, (rank, world)),
    )


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
        validation_split=check_split(opts.validation_split, opts.subset),
        subset=opts.subset,
        seed=seed,
        stratify=opts.stratify,
        cut=opts.validation_cut,
    )


def _pipeline(opts: ImageOptions, source: Source, image_size: Any, augment: Any) -> Any:
    """The decode + transform pipeline of the image options, resolved against ``source``."""
    return image_pipeline(
        opts,
        augment,
        image_size,
        fast=config.fast_decode(opts.fast_decode, augment),
        channels=pixels_mod.channels(opts.color_mode, source.pixel_channels()),
    )


def _mask_map(value: Any, has_masks: bool) -> MaskMap | None:
    """``mask_map``: None, or a MaskMap for a source with masks."""
    if value is None:
        return None
    if not has_masks:
        raise ConfigError(
            f"mask_map={value!r} maps mask values, and this source has no masks; pass masks= "
            "(or a CSV with an image,mask header), or drop mask_map"
        )
    return MaskMap(value)


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
