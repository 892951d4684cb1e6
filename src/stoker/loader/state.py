"""The loader's saved position: a JSON-able dict (``state_dict``), its checks on resume, and
arithmetic on it. A position counts batches the training step received."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, warn

STATE_VERSION = 1
#: what must match between a saved state and the loader resuming from it
MUST_MATCH = ("fingerprint", "seed", "batch_size", "batches")


def make_state(
    epoch: int, position: int, *, seed: int, batch_size: int, batches: int, fingerprint: Any
) -> dict[str, Any]:
    """The state for ``(epoch, position)`` of a loader with these settings."""
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "position": position,
        "seed": seed,
        "batch_size": batch_size,
        "batches": batches,
        "fingerprint": fingerprint,
    }


def check_state(
    state: dict[str, Any], mine: dict[str, Any], older: Sequence[str] = ()
) -> tuple[int, int]:
    """``(epoch, position)`` of ``state``, after checking it was saved by a loader like the
    one whose own state is ``mine``; a ConfigError says what differs. ``older``: this
    dataset's fingerprints as earlier releases computed them, accepted with a warning."""
    if state.get("fingerprint") in older:
        warn(
            "this state was saved by an earlier stoker, whose dataset fingerprint did not "
            "cover the tars' contents; it matches this dataset's tar names, sizes, members and "
            "labels, and is resumed. Save a new state to have the full check"
        )
        state = {**state, "fingerprint": mine["fingerprint"]}
    if state.get("version") != STATE_VERSION:
        raise ConfigError(
            f"state version {state.get('version')!r}; this stoker reads {STATE_VERSION}"
        )
    if state.get("fingerprint") != mine["fingerprint"]:
        raise ConfigError(
            f"this state was saved for another dataset (fingerprint {state.get('fingerprint')!r}"
            f", this loader's {mine['fingerprint']!r}): its files, their labels or its tars' "
            "contents differ. Resume with the dataset the state was saved for, or pass {} to "
            "load_state_dict to start afresh"
        )
    for key in MUST_MATCH:
        if state.get(key) != mine[key]:
            raise ConfigError(
                f"this state was saved for a different {key} ({state.get(key)!r}, here "
                f"{mine[key]!r}); resume with the same dataset and settings"
            )
    return int(state["epoch"]), int(state["position"])


def advance_state(state: dict[str, Any], batches: int) -> dict[str, Any]:
    """The state ``batches`` batches after ``state`` (epochs roll over at their length)."""
    position = int(state["position"]) + int(batches)
    per_epoch = int(state["batches"])
    return {
        **state,
        "epoch": int(state["epoch"]) + position // per_epoch,
        "position": position % per_epoch,
    }
