"""The machinery of the option groups (``options``): a group's field is one ``Loader``
argument, declared once by ``name: type = option(default, doc, check=...)``, and ``make_group``
builds a group from the keywords given, each value checked by its field's check.

The checks here adapt ``config``'s functions to a field's ``(name, value)`` call; a group's
checks across fields are its own ``__post_init__``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, fields
from functools import partial
from typing import Any

from ..errors import ConfigError
from . import config

#: A field's check: ``(name, value) -> the value kept`` (or a ConfigError naming the argument).
Check = Callable[[str, Any], Any]


def option(default: Any, doc: str, check: Check | None = None) -> Any:
    """One ``Loader`` argument, as a group's field: its type is the field's annotation (the one
    type shown and checked: no second spelling), ``doc`` one line of meaning, ``check`` run on
    the value given (or the default) by ``make_group``."""
    return field(default=default, metadata={"doc": doc, "check": check})


def make_group(group: type, kwargs: dict[str, Any]) -> Any:
    """One group made from ``kwargs`` (its fields' defaults for the others), each value
    checked by its field's check, then the group's own checks across fields."""
    values = {}
    for f in fields(group):
        value = kwargs.get(f.name, f.default)
        check = f.metadata["check"]
        values[f.name] = value if check is None else check(f.name, value)
    return group(**values)


def of_value(fn: Callable[[Any], Any]) -> Check:
    """A check from a function of the value alone."""
    return lambda name, value: fn(value)


#: ``True`` or ``False``, named in the error.
flag: Check = config.flag
#: ``True``, ``False`` or ``None``, named in the error.
flag_or_none: Check = partial(config.flag, allow_none=True)


def storage_options(value: Any) -> Any:
    """``storage_options`` kept as a ``StorageOptions`` (its ``repr`` shows no value), or None;
    anything but a dict is refused."""
    from ..sources.store import StorageOptions

    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(
            f"storage_options must be a dict of the filesystem's options (e.g. "
            f"{{'endpoint_url': ...}}), got {type(value).__name__}"
        )
    return StorageOptions(value)
