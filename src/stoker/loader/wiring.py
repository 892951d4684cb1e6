"""From ``Loader``'s arguments to the parts it wires together: the source (opened, split, its
classes picked), the decode pipeline, the epoch plan, the batch's schema.

Each step validates its own arguments with a message that says the fix; nothing is started
here (no worker, no shared memory), so a wrong argument costs nothing.
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
from ..schema import BatchSchema, Columns, SlotLayout, field_specs, resolve_form
from ..sources import open_source
from ..sources.base import Source
from ..transforms import CustomPipeline, check_mask_ops, make_pipeline
from . import config
from .selection import check_split, select


@dataclass
class Parts:
    """What a Loader is made of, before anything runs."""

    source: Source
    image_size: tuple[int, int]
    augment: Any
    pipeline: Any
    has_masks: bool
    drop_last: bool
    max_errors: int
    plan: Plan
    schema: BatchSchema
    batch_fn: BatchTransform | None


def build(args: dict[str, Any], batch_size: int, seed: int, shuffle: bool) -> Parts:
    """The parts for ``Loader(**args)`` (``batch_size``, ``seed``, ``shuffle`` validated)."""
    drop_last = config.flag("drop_last", args["drop_last"], allow_none=True)
    max_pixels = config.positive_int("max_pixels", args["max_pixels"])  # before opening files
    source = _source(args, seed)
    pixels = source.pixel_size()
    image_size = config.image_size(args["image_size"], pixels)
    augment = config.augment(args["augment"], pixels, args["subset"])
    pipeline = _pipeline(args, source, image_size, augment, max_pixels)
    has_masks = bool(source.has_masks)
    if has_masks and args["pad_to_aspect_ratio"]:
        raise ConfigError(
            "pad_to_aspect_ratio=True with masks: the black border has no class to give the "
            "mask; use crop_to_aspect_ratio=True, or augment=None (a plain resize of both)"
        )
    if has_masks and isinstance(pipeline, CustomPipeline):
        check_mask_ops(pipeline.ops)
    pipeline.mask_map = _mask_map(args["mask_map"], has_masks)
    if has_masks and pipeline.post:
        check_mask_ops(pipeline.post)
    if drop_last is None:  # training drops the ragged batch; evaluation sees every sample
        drop_last = shuffle and args["subset"] != "validation"
    max_errors = config.max_errors(args["max_errors"], len(source))
    plan = _plan(args, source, batch_size, seed, shuffle, drop_last)
    weight, fields = args["sample_weight"], args["fields"]
    columns = Columns(batch_mod.columns(source, weight, fields, args["label_mode"]))
    specs = field_specs(image_size, pipeline.channels, has_masks, columns, source.sample_fields)
    batch_fn = None
    if args["batch_transform"] is not None:  # probed here: the fields it leaves make the slot
        batch_fn = BatchTransform(args["batch_transform"], specs, batch_size)
        specs = batch_fn.outputs
    layout = SlotLayout(batch_size, specs)
    form = resolve_form(args["batch"], [f[0] for f in layout.fields], source.sample_form)
    return Parts(
        source=source,
        image_size=image_size,
        augment=augment,
        pipeline=pipeline,
        has_masks=has_masks,
        drop_last=drop_last,
        max_errors=max_errors,
        plan=plan,
        schema=BatchSchema(layout, columns, form),
        batch_fn=batch_fn,
    )


def _source(args: dict[str, Any], seed: int) -> Source:
    """The opened source, split (``validation_split``/``subset``) and its classes picked."""
    named = batch_mod.column_names(args["sample_weight"], args["fields"])
    split = check_split(args["validation_split"], args["subset"])
    opened = open_source(
        args["source"],
        paths=args["paths"],
        labels=args["labels"],
        masks=args["masks"],
        label_column=args["label_column"],
        columns=named,
        spec=args["spec"],
    )
    return select(
        opened,
        class_names=args["class_names"],
        validation_split=split,
        subset=args["subset"],
        seed=seed,
        stratify=config.flag("stratify", args["stratify"]),
    )


def _pipeline(
    args: dict[str, Any], source: Source, image_size: Any, augment: Any, max_pixels: int
) -> Any:
    """The decode + transform pipeline: augmentation, size, channels, resize, aspect fit."""
    crop, pad = args["crop_to_aspect_ratio"], args["pad_to_aspect_ratio"]
    if crop and pad:
        raise ConfigError("pass crop_to_aspect_ratio=True or pad_to_aspect_ratio=True, not both")
    return make_pipeline(
        augment,
        image_size,
        config.fast_decode(args["fast_decode"], augment),
        max_pixels,
        channels=pixels_mod.channels(args["color_mode"], source.pixel_channels()),
        interpolation=pixels_mod.interpolation(args["interpolation"]),
        fit="crop" if crop else "pad" if pad else None,
        strict_decode=config.flag("strict_decode", args.get("strict_decode", False)),
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
    args: dict[str, Any],
    source: Source,
    batch_size: int,
    seed: int,
    shuffle: bool,
    drop_last: bool,
) -> Plan:
    """Which samples each batch of each epoch holds, for this rank."""
    rank, world = config.rank_world(args["rank"], args["world_size"])
    blocks = getattr(source, "block_sizes", None)
    plan = Plan(
        len(source),
        batch_size,
        seed,
        shuffle,
        drop_last,
        rank,
        world,
        block_sizes=tuple(int(b) for b in blocks) if blocks else None,
        split=config.check_rank_split(args["rank_split"]),
    )
    if plan.batches() == 0:
        raise ConfigError(
            f"{len(source)} samples make no full batch of {batch_size} with "
            "drop_last=True: lower batch_size or pass drop_last=False"
        )
    return plan
