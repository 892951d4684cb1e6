"""What the ``stoker`` command says when something goes wrong: one plain line each.

An error is one line on stderr (``stoker CMD: error: ...``), and names the flag the user typed
(``--batch-size``), not the ``Loader`` argument it became (``batch_size``). A
:class:`~stoker.errors.StokerWarning` is one line too (``stoker CMD: warning: ...``), without
Python's file, line number and source line; other warnings keep Python's format.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from ..errors import StokerError, StokerWarning, one_line

__all__ = ["plain", "plain_warnings"]


def plain(exc: BaseException, args: argparse.Namespace) -> str:
    """The error plainly: stoker's own message as it is (it names the file and the fix), with
    the command's flags for the arguments they set; an OS error as its reason and file;
    anything else in one line with where to see more."""
    if isinstance(exc, StokerError):
        return flags_named(str(exc).strip() or type(exc).__name__, args)
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    return f"{one_line(exc)} (--debug shows the traceback)"


def flags_named(text: str, args: argparse.Namespace) -> str:
    """``text`` with each argument the command's options set named by its flag:
    ``batch_size=0`` -> ``--batch-size 0``, ``lower batch_size`` -> ``lower --batch-size``
    (a bare name only when it holds an underscore, so plain words stay words)."""
    for dest in vars(args):
        flag = "--" + dest.replace("_", "-")
        text = re.sub(rf"\b{dest}=", flag + " ", text)
        if "_" in dest:
            text = re.sub(rf"\b{dest}\b", flag, text)
    return text


@contextmanager
def plain_warnings(command: str, args: argparse.Namespace) -> Iterator[None]:
    """While the command runs, a StokerWarning is printed as one line on stderr."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if not issubclass(category, StokerWarning):
                shown(message, category, filename, lineno, file, line)
                return
            words = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
            print(f"stoker {command}: warning: {flags_named(words, args)}", file=sys.stderr)

        warnings.showwarning = show
        yield
