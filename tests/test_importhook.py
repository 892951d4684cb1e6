"""One import watch serves every stage that must act when a module is imported (thread pools,
seeding): each callback runs once, in order, right after the module's own code."""

from __future__ import annotations

import sys

from stoker.importhook import AfterImport, after_import


def test_two_watchers_of_one_module_both_run_once_and_the_finder_leaves(tmp_path, monkeypatch):
    (tmp_path / "watched_lib.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    seen = []
    after_import("watched_lib", lambda m: seen.append(("pools", m.value)))
    after_import("watched_lib", lambda m: seen.append(("seed", m.value)))
    assert sum(isinstance(f, AfterImport) for f in sys.meta_path) == 1
    import watched_lib  # noqa: F401, PLC0415

    assert seen == [("pools", 1), ("seed", 1)]
    assert not any(isinstance(f, AfterImport) for f in sys.meta_path)
    after_import("watched_lib", lambda m: seen.append(("late", m.value)))  # already imported
    assert seen[-1] == ("late", 1)
    monkeypatch.delitem(sys.modules, "watched_lib")
