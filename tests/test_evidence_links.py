"""Comments state the rule and link the evidence: every ``benchmarks/README.md#anchor`` that the
source, the README or a docs page names is an anchor of that file (``<a id="...">`` or a
heading's slug). The docs site quotes the latest figures (docs/performance.md) and points into
the dated log for the rest; the log itself is not on the site."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"benchmarks/README\.md#([a-z0-9-]+)")


def _anchors(text: str) -> set[str]:
    ids = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        ids.add(re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-"))
    return ids


def test_every_evidence_link_in_the_source_names_an_anchor_of_the_benchmarks_readme():
    anchors = _anchors((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8"))
    links = {
        (path.relative_to(ROOT).as_posix(), anchor)
        for path in (ROOT / "src" / "stoker").rglob("*.py")
        for anchor in LINK.findall(path.read_text(encoding="utf-8"))
    }
    assert len(links) >= 5  # the read-ahead, native reads, arrays, crop decode, seeding rules
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {
        (path.relative_to(ROOT).as_posix(), anchor)
        for path in pages
        for anchor in LINK.findall(path.read_text(encoding="utf-8"))
    }
    assert len({a for p, a in cited if p == "docs/performance.md"}) >= 15  # every case's entry
    links |= cited
    missing = sorted(f"{where}: #{anchor}" for where, anchor in links if anchor not in anchors)
    assert not missing, "links to no anchor of benchmarks/README.md:\n" + "\n".join(missing)
