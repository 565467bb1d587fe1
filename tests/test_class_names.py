"""No two classes of the packages share a name, so that a name in the code or the docs means one thing.

The privacy event ``GaussianSketch`` (``dpaudit.mechanisms.privacy``) and the sampler of its release
(``GaussianSketchRelease``, ``dpaudit.release_audit.releases``) are different objects and carry different names.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dpaudit", "attacks", "accountants")


def class_definitions(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each class name → where it is defined (``path:line``), for the source texts ``sources`` (path → text)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text, filename=path)):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path}:{node.lineno}")
    return found


def shared_names(sources: dict[str, str]) -> dict[str, list[str]]:
    """The class names defined more than once in ``sources``, with their places."""
    return {name: places for name, places in class_definitions(sources).items() if len(places) > 1}


def _package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def test_no_two_classes_share_a_name():
    sources = _package_sources()
    assert any(path.startswith("dpaudit/") for path in sources)
    assert shared_names(sources) == {}


def test_check_finds_a_shared_name():
    sources = {"a.py": "class Event:\n    pass\n", "b.py": "def f():\n    class Event:\n        pass\n"}
    assert shared_names(sources) == {"Event": ["a.py:1", "b.py:2"]}
