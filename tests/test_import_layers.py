"""dpaudit's modules import each other in one direction: the data flow's stages, never back up (no cycles).

Each stage may import its own and earlier stages. A function-level (lazy) import that goes up a stage is allowed
only where ``_LAZY_UPWARD`` names it with the reason. Imports are read from the source (ast), so the test also
sees imports that a run would not reach.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dpaudit"
# The stages, lowest first: a module belongs to the first stage that names it or a package above it (the top package
# "dpaudit" names itself only).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundations",
        (
            "dpaudit",
            "dpaudit.version",
            "dpaudit.errors",
            "dpaudit.seeding",
            "dpaudit.background",
            "dpaudit.formatting",
            "dpaudit.user_code",
            "dpaudit.files",
            "dpaudit.linalg",
        ),
    ),
    ("catalogue", ("dpaudit.mechanisms.catalogue", "dpaudit.mechanisms.privacy", "dpaudit.training.sampling")),
    ("config", ("dpaudit.config", "dpaudit.parallel")),
    ("run directory", ("dpaudit.campaign.store",)),
    ("data and models", ("dpaudit.data", "dpaudit.models")),
    ("mechanisms", ("dpaudit.mechanisms", "dpaudit.release_audit.releases")),
    ("training", ("dpaudit.training",)),
    ("campaign", ("dpaudit.campaign", "dpaudit.training_audit")),
    ("analysis", ("dpaudit.analysis", "dpaudit.release_audit")),
    ("reporting", ("dpaudit.reporting",)),
    ("entry points", ("dpaudit.api", "dpaudit.cli", "dpaudit.studies", "dpaudit.__main__")),
)
# (importer, imported) → why the importer imports it inside a function although it sits higher.
_LAZY_UPWARD = {
    ("dpaudit", "dpaudit.api"): "dpaudit.audit is the package's entry point; importing dpaudit stays torch-free",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _stage(module: str) -> int:
    """The index of the first stage naming ``module`` or one of the packages it is in."""
    for index, (_, members) in enumerate(STAGES):
        if any(module == member or (member != "dpaudit" and module.startswith(member + ".")) for member in members):
            return index
    raise AssertionError(f"{module} belongs to no stage of tests/test_import_layers.py: add it to STAGES")


def _imported(importer: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    """The dpaudit modules ``node`` imports (a ``from X import name`` of a submodule names the submodule)."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = importer.split(".")[: None if is_package else -1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    found = []
    for name in candidates:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def _walk(name: str, node: ast.AST, is_package: bool, lazy: bool) -> list[tuple[str, str, bool, int]]:
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            found += [
                (name, target, lazy, child.lineno) for target in _imported(name, child, is_package) if target != name
            ]
        elif not (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)):  # annotations: never run
            found += _walk(name, child, is_package, lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))
    return found


def _edges() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, lazy, line) for every import of a dpaudit module by a dpaudit module."""
    edges = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))

        edges.extend(_walk(name, tree, path.name == "__init__.py", lazy=False))
    return edges


EDGES = _edges()


def test_every_module_has_a_stage():
    assert len(MODULES) > 40  # the walk found the package
    for module in MODULES:
        _stage(module)


def test_no_import_runs_from_a_lower_stage_to_a_higher_one():
    upward = [
        f"{importer}:{line} imports {imported} ({STAGES[_stage(importer)][0]} → {STAGES[_stage(imported)][0]})"
        for importer, imported, lazy, line in EDGES
        if _stage(imported) > _stage(importer) and not (lazy and (importer, imported) in _LAZY_UPWARD)
    ]
    assert not upward, "imports against the data flow:\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycle_counting_lazy_imports():
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for importer, imported, _, _ in EDGES:
        if (importer, imported) not in _LAZY_UPWARD:
            graph[importer].add(imported)
    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize(
    ("importer", "imported", "expected_upward"),
    [("dpaudit.config", "dpaudit.campaign.runner", True), ("dpaudit.campaign.runner", "dpaudit.config", False)],
)
def test_the_stage_order_itself(importer, imported, expected_upward):
    """The check the layering test applies: config sits below the runner, so only config → runner is upward."""
    assert (_stage(imported) > _stage(importer)) is expected_upward


def test_every_documented_lazy_import_exists():
    """An allowance that no import uses any more is removed, so the list states only what the code does."""
    lazy = {(importer, imported) for importer, imported, is_lazy, _ in EDGES if is_lazy}
    assert set(_LAZY_UPWARD) <= lazy
