"""The house rules a newcomer can rely on: at most 10 modules at the package root (the rest lives in a
folder per domain), no module over 500 lines, the two lanes never import each other (what both use has a
home of its own), and no import cycle between the package's parts."""

from __future__ import annotations

import ast
import graphlib
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.settings import project_root

PACKAGE = project_root() / "lanes_pipeline"
MAX_ROOT_MODULES = 10
MAX_LINES = 500


def test_at_most_10_modules_at_the_package_root() -> None:
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, modules


def test_no_module_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")
    }
    assert len(sizes) > 50  # the package was found
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}


def part_of(module: str, package: Path) -> str | None:
    """The package's part a dotted module belongs to: its folder at the root, or the root module itself."""
    parts = module.split(".")
    if parts[0] != package.name or len(parts) < 2:
        return None
    return parts[1] if (package / parts[1]).is_dir() or (package / f"{parts[1]}.py").is_file() else None


def imports_between_parts(package: Path = PACKAGE) -> dict[tuple[str, str], set[str]]:
    """(importing part, imported part) -> the files that import across, lazy and TYPE_CHECKING imports
    included: a cycle hidden inside a function is still a cycle a reader has to untangle."""
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in package.rglob("*.py"):
        relative = path.relative_to(package.parent)
        source = relative.parts[1].removesuffix(".py")
        for node in ast.walk(parse_python(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                target = part_of(name, package)
                if target is not None and target != source:
                    edges[(source, target)].add(str(relative))
    return edges


def test_the_lanes_never_import_each_other() -> None:
    edges = imports_between_parts()
    assert ("cpu_lane", "dataset") in edges  # the scan sees imports (the CPU lane writes the dataset)
    assert edges.get(("cpu_lane", "gpu_lane"), set()) == set()
    assert edges.get(("gpu_lane", "cpu_lane"), set()) == set()


def import_cycle(edges: dict[tuple[str, str], set[str]]) -> list[str]:
    """One cycle between parts, each step with the files that make it; [] when there is none."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        cycle = error.args[1]  # [a, ..., a], each node depending on the one before it was reached from
        return [f"{a} <- {b} ({', '.join(sorted(edges[(b, a)]))})" for a, b in itertools.pairwise(cycle)]
    return []


def test_no_import_cycle_between_the_parts_of_the_package() -> None:
    assert import_cycle(imports_between_parts()) == []


@pytest.mark.parametrize("lazy", [False, True])
def test_a_cycle_between_parts_is_seen(tmp_path: Path, lazy: bool) -> None:
    package = tmp_path / "lanes_pipeline"
    (package / "alpha").mkdir(parents=True)
    (package / "alpha" / "one.py").write_text("from lanes_pipeline.beta import two\n")
    back = (
        "def two() -> None:\n    from lanes_pipeline.alpha import one\n"
        if lazy
        else "import lanes_pipeline.alpha.one\n"
    )
    (package / "beta.py").write_text(back)
    edges = imports_between_parts(package)
    assert set(edges) == {("alpha", "beta"), ("beta", "alpha")}
    assert len(import_cycle(edges)) == 2
