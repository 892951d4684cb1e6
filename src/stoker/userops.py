"""The user's augment callables: checked up front for masks, run on the pipeline's output, and
what they return checked, with an error that names the op and the fix."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import pixels
from .crops import resize_mask_into
from .errors import ConfigError
from .pixels import resize_into


def op_module(op: Any) -> str:
    """The module a callable (a function, or an object's class) is defined in."""
    return str(getattr(op, "__module__", None) or type(op).__module__)


def pair_step(op: Any, image: np.ndarray, mask: np.ndarray, rng: Any) -> tuple[Any, Any]:
    """One callable on an image and its mask: a stock op's ``pair``, else the user's
    ``(image, mask, rng) -> (image, mask)``."""
    pair = getattr(op, "pair", None)
    out = pair(image, mask, rng) if pair is not None else op(image, mask, rng)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"augment transform {_op_name(op)} returned {type(out).__name__}; with masks it is "
            "called as (image, mask, rng) and must return the pair (image, mask)"
        )
    return out


def _op_name(op: Any) -> str:
    return getattr(op, "__name__", type(op).__name__)


def check_mask_ops(ops: Sequence[Any]) -> None:
    """Refuse, up front, a stock op that has no mask form (``pair``) for a source with masks."""
    for op in ops:
        if hasattr(op, "pair"):
            continue
        if type(op).__module__.startswith("stoker."):
            raise ConfigError(
                f"augment: stoker.ops.{type(op).__name__} has no mask form, so a source with "
                "masks cannot use it; drop it, or wrap it in your own (image, mask, rng) -> "
                "(image, mask) function that applies its geometry to the mask"
            )
        if not _takes(op, 3):
            raise ConfigError(
                f"augment={_op_name(op)}: with masks each callable is called as (image, mask, "
                "rng) and returns (image, mask), the same geometry applied to both "
                "(nearest-neighbour for the mask); this one cannot take three arguments"
            )


def _takes(fn: Any, count: int) -> bool:
    """Whether ``fn`` can be called with ``count`` positional arguments (True if unknown)."""
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): find out when it is called
        return True
    return True


def check_user_mask(mask: Any, image: np.ndarray, ops: list[Any]) -> np.ndarray:
    """A user transform's mask: ``uint8`` ``(h, w)``, the size of the image it returned."""
    arr = np.asarray(mask)
    if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape != image.shape[:2]:
        names = ", ".join(_op_name(op) for op in ops)
        raise TypeError(
            f"augment transform ({names}) returned a {arr.dtype} mask of shape {arr.shape} "
            f"with an image of shape {image.shape}; the mask must be uint8 (h, w), the "
            "image's size: apply the same geometry to both (nearest-neighbour for the mask)"
        )
    return arr


def run_post(
    ops: Sequence[Callable[..., np.ndarray]], rng: Any, out: np.ndarray, channels: int, how: str
) -> None:
    """``augment=["train", op, ...]``: run the ops on the pipeline's output ``out`` (the batch
    slot, at the output size) and write their result back into it."""
    image: np.ndarray = out[:, :, 0] if channels == 1 else out
    for op in ops:
        image = op(image, rng)
    image = check_user_image(image, list(ops))
    if image is out:
        return
    if np.shares_memory(image, out):  # a view of the slot (a flip, a crop): copy it out first
        image = image.copy()
    resize_into(pixels.to_channels(image, channels), out, how)


def run_post_pair(
    ops: Sequence[Callable[..., Any]],
    rng: Any,
    out: np.ndarray,
    mask_out: np.ndarray,
    channels: int,
    how: str,
) -> None:
    """``run_post`` for an image and its mask: each op's ``pair`` form (or the user's
    ``(image, mask, rng) -> (image, mask)``), results written back into both slots."""
    image: np.ndarray = out[:, :, 0] if channels == 1 else out
    mask: np.ndarray = mask_out
    for op in ops:
        image, mask = pair_step(op, image, mask, rng)
    image = check_user_image(image, list(ops))
    mask = check_user_mask(mask, image, list(ops))
    if image is not out:
        image = image.copy() if np.shares_memory(image, out) else image
        resize_into(pixels.to_channels(image, channels), out, how)
    if mask is not mask_out:
        resize_mask_into(mask.copy() if np.shares_memory(mask, mask_out) else mask, mask_out)


def check_user_image(image: Any, ops: list[Any]) -> np.ndarray:
    """Accept what a user transform returned if it is an image; otherwise say what is wrong."""
    arr = np.asarray(image)
    if (
        arr.dtype != np.uint8
        or arr.ndim not in (2, 3)
        or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4))
    ):
        names = ", ".join(getattr(op, "__name__", type(op).__name__) for op in ops)
        raise TypeError(
            f"augment transform ({names}) returned {arr.dtype} array of shape {arr.shape}; it must "
            "return a uint8 image of shape (h, w, 3)"
        )
    return arr
