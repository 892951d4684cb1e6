"""The Loader's public names are the ones ``docs/api.md`` lists, each with its reason: a new
public name cannot slip in undocumented, and a removed one cannot stay in the docs."""

from __future__ import annotations

import pathlib
import re

import numpy as np

import stoker

API = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _listed() -> dict[str, str]:
    """``name -> reason`` from the table under "The Loader's public names"."""
    section = API.read_text().split("## The Loader's public names", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.+) \|$", section, flags=re.MULTILINE)
    return dict(rows)


def test_the_loaders_public_names_are_the_ones_docs_api_lists_with_a_reason() -> None:
    with stoker.Loader(np.zeros((8, 8, 8, 3), np.uint8), batch_size=4, workers=0) as loader:
        public = {n for n in dir(loader) if not n.startswith("_")}
    listed = _listed()
    assert public - listed.keys() == set(), "public on Loader, missing from docs/api.md"
    assert listed.keys() - public == set(), "listed in docs/api.md, not on Loader"
    assert all(len(why.split()) >= 3 for why in listed.values()), listed
