"""What the package imports is declared: every third-party module imported under lanes_pipeline/ belongs to a
distribution named in pyproject.toml. One imported at module level (needed whenever that module loads) is a
core dependency; one imported only inside a function or under `except ImportError` (an optional path) may
be an extra instead. A dependency that arrives only through another one (click through dagster, numpy
through scipy) breaks the day that one drops it."""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.settings import project_root

ROOT = project_root()
PACKAGE = ROOT / "lanes_pipeline"
# Folders of the package that hold data, not its code: the sample repository's files are the user's code
# the pipeline reads (they import their own modules and pytest).
NOT_CODE = [PACKAGE / "repos" / "sample_repo"]
FIRST_PARTY = {"lanes_pipeline", "__future__"}


@dataclass(frozen=True)
class Imported:
    module: str  # the top-level name, e.g. "yaml"
    where: str  # file:line
    optional: bool  # inside a function body or under `except ImportError`


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        caught = handler.type
        for each in caught.elts if isinstance(caught, ast.Tuple) else [caught]:
            if isinstance(each, ast.Name):
                names.add(each.id)
    return bool(names & {"ImportError", "ModuleNotFoundError"})


class _Imports(ast.NodeVisitor):
    def __init__(self, where: str) -> None:
        self.where, self._optional = where, 0
        self.found: list[Imported] = []

    def _enter(self, node: ast.AST, optional: bool) -> None:
        self._optional += optional
        self.generic_visit(node)
        self._optional -= optional

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._enter(node, True)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._enter(node, True)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = _catches_import_error(node)
        for statement in node.body:
            self._optional += guarded
            self.visit(statement)
            self._optional -= guarded
        for rest in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(rest)

    def _add(self, name: str, line: int) -> None:
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
            self.found.append(Imported(top, f"{self.where}:{line}", self._optional > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module, node.lineno)


def imports_of(source: str, where: str) -> list[Imported]:
    """The third-party modules `source` imports, each with where and whether only an optional path does."""
    visitor = _Imports(where)
    visitor.visit(parse_python(source))
    return visitor.found


def package_imports() -> list[Imported]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path.is_relative_to(folder) for folder in NOT_CODE):
            continue
        found += imports_of(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return found


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(the core dependencies, each extra's), as canonical distribution names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(requirements: list[str]) -> set[str]:
        return {canonicalize_name(Requirement(r).name) for r in requirements}

    extras = project.get("optional-dependencies", {})
    return names(project["dependencies"]), {extra: names(reqs) for extra, reqs in extras.items()}


def distributions_of(module: str, installed: dict[str, list[str]]) -> set[str]:
    """The distributions that provide `module`; for one not installed here (an extra nobody installed), the
    module's own name, which is the distribution's for every package this project uses that way."""
    return {canonicalize_name(name) for name in installed.get(module, [module])}


def undeclared(imported: list[Imported], core: set[str], extras: dict[str, set[str]]) -> list[str]:
    """Each import whose distribution pyproject.toml does not declare where it must: a module-level import
    among the core dependencies, an optional one among them or in an extra."""
    installed = packages_distributions()
    anywhere = core.union(*extras.values())
    problems = []
    for each in imported:
        dists = distributions_of(each.module, installed)
        if not dists & anywhere:
            problems.append(f"{each.where}: {each.module} ({', '.join(sorted(dists))}) is not declared")
        elif not each.optional and not dists & core:
            problems.append(
                f"{each.where}: {each.module} is imported at module level but only an extra declares it"
            )
    return problems


def test_every_third_party_import_of_the_package_is_declared() -> None:
    assert all(folder.is_dir() for folder in NOT_CODE)  # what the scan leaves out is still there
    imported = package_imports()
    modules = {each.module for each in imported}
    assert {"click", "dagster", "pydantic", "yaml"} <= modules  # the scan sees the package's imports
    core, extras = declared()
    assert undeclared(imported, core, extras) == []


def test_the_scan_tells_a_module_level_import_from_an_optional_one() -> None:
    source = (
        "import os\nimport yaml\nfrom lanes_pipeline import settings\n"
        "try:\n    import uv\nexcept ImportError:\n    uv = None\n"
        "def train():\n    from trl import SFTTrainer\n"
    )
    found = {each.module: each.optional for each in imports_of(source, "example.py")}
    assert found == {"yaml": False, "uv": True, "trl": True}


def test_an_undeclared_or_misplaced_import_is_named_with_its_place() -> None:
    imported = [
        Imported("yaml", "a.py:1", optional=False),
        Imported("not_a_declared_package", "b.py:2", optional=True),
        Imported("trl", "c.py:3", optional=False),
    ]
    problems = undeclared(imported, core={"pyyaml"}, extras={"bench": {"trl"}})
    assert problems == [
        "b.py:2: not_a_declared_package (not-a-declared-package) is not declared",
        "c.py:3: trl is imported at module level but only an extra declares it",
    ]
