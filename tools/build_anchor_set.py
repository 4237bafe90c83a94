"""Build the anchor set's manifest, lanes_pipeline/gpu_lane/anchor_packages/anchors.json (see anchor_set.py).

Why a builder: which tests judge a function is a fact to measure, not to guess. For every public top-level
function of the chosen modules, its body is gutted (replaced by `raise NotImplementedError`, signature and
docstring kept) and the package's own test suite runs. The tests that passed on the real code (twice, with
two hash seeds, so flaky ones are left out; known flaky ones are in `Source.deselect`) and fail on the
gutted one judge it; a function none of whose own tests (tests whose code names it) fails is no task. Up to
MAX_TESTS of them are kept (its own tests first, spread over its test functions), and the task is kept only
if, run alone as repo_tasks.judge_body runs them, they all pass on the real code and at least one fails on
the gutted one. Each run is the package's own code with the project's pytest, outside the sandbox; the
reference check of anchor_set.load_anchor_set repeats it in the sandbox on every machine.

Command (from the repository root; about 25 minutes on two cores):

    .venv/bin/python tools/build_anchor_set.py [--jobs 2]

It reads the sdists vendored in lanes_pipeline/gpu_lane/anchor_packages/ (byte-identical to PyPI's: to add or
upgrade one, `pip download --no-binary :all: --no-deps NAME==VER -d lanes_pipeline/gpu_lane/anchor_packages`
and edit SOURCES below), builds each package's repository exactly as anchor_set does, and rewrites
anchors.json; run again, it gives the same file.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from lanes_pipeline.dataset.holdout_rules import mask
from lanes_pipeline.gpu_lane.anchor_set import (
    MANIFEST_FILE,
    PACKAGES_DIR,
    AnchorManifest,
    AnchorPackage,
    AnchorTask,
    package_repo,
)
from lanes_pipeline.gpu_lane.humaneval import load_problems
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.symbols import Symbol, names_in
from lanes_pipeline.sandbox.isolation import REPORT_PLUGIN, export_commit

MAX_TESTS = 20  # tests per task: enough to judge, few enough that one judge run stays about a second
BOLTONS_MODULES = (
    "dictutils",
    "fileutils",
    "formatutils",
    "funcutils",
    "iterutils",
    "listutils",
    "mathutils",
    "queueutils",
    "setutils",
    "statsutils",
    "strutils",
    "tableutils",
    "timeutils",
    "typeutils",
    "urlutils",
)
BOLTONS_MORE_TESTS = ("funcutils_fb", "funcutils_fb_py3", "statsutils_histogram")
RUN_TIMEOUT_S = 600
# As isolation.run_pytest_outcomes runs pytest in the sandbox, with the same reporting plugin.
PYTEST_ARGS = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "lanes_sandbox_report")
GUTTED = "raise NotImplementedError  # gutted by tools/build_anchor_set.py"


@dataclass(frozen=True)
class Source:
    """One package: where its candidate functions and its tests are, and what is left out and why."""

    name: str
    version: str
    licence: str
    modules: tuple[str, ...]  # whose public top-level functions are candidates
    tests: tuple[str, ...]  # test modules run (doctest-only ones are left out: they judge nothing alone)
    omit: Mapping[str, str] = field(default_factory=dict)  # sdist paths left out of the repository -> why
    deselect: Mapping[str, str] = field(default_factory=dict)  # tests that never judge -> why


SOURCES = (
    Source(
        name="more-itertools",
        version="10.5.0",
        licence="MIT",
        modules=("more_itertools/more.py", "more_itertools/recipes.py"),
        tests=("tests/test_more.py", "tests/test_recipes.py"),
        deselect={
            "tests/test_more.py::CallbackIterTests::test_abort": "races a 0.1 s sleep in a thread: it failed "
            "once on a busy machine",
            "tests/test_more.py::TimeLimitedTests::test_basic": "a 0.1 s time limit against a 0.2 s sleep",
        },
    ),
    Source(
        name="toolz",
        version="1.0.0",
        licence="BSD-3-Clause",
        modules=(
            "toolz/dicttoolz.py",
            "toolz/functoolz.py",
            "toolz/itertoolz.py",
            "toolz/recipes.py",
            "toolz/utils.py",
            "toolz/sandbox/core.py",
            "toolz/sandbox/parallel.py",
        ),
        tests=tuple(
            f"toolz/tests/test_{m}.py"
            for m in (
                "compatibility",
                "curried",
                "dicttoolz",
                "functoolz",
                "inspect_args",
                "itertoolz",
                "recipes",
                "serialization",
                "signatures",
                "tlz",
                "utils",
            )
        ),
    ),
    Source(
        name="boltons",
        version="24.1.0",
        licence="BSD-3-Clause",
        modules=tuple(f"boltons/{m}.py" for m in BOLTONS_MODULES),
        # each module's own test module, and the three that test one of them further
        tests=tuple(f"tests/test_{m}.py" for m in sorted((*BOLTONS_MODULES, *BOLTONS_MORE_TESTS))),
        omit={
            "tests/conftest.py": "its pytest_ignore_collect(path) hook is refused by pytest 9; it only "
            "skips `_py2` test modules, and the sdist has none"
        },
        deselect={
            "tests/test_fileutils.py::test_iter_find_files": "`path.lstrip(BOLTONS_PATH)` strips a set of "
            "characters: it passes or fails with the letters of the random temporary folder's name"
        },
    ),
    Source(
        name="inflection",
        version="0.5.1",
        licence="MIT",
        modules=("inflection/__init__.py",),
        tests=("test_inflection.py",),
    ),
)


@dataclass
class Runner:
    """Runs the package's tests with the project's pytest, reporting each test's outcome as the sandbox's
    reporter does (the same plugin), in a fresh copy of the tree each time."""

    real: Path  # the commit's tree, as the sandbox exports it
    scratch: Path
    harness: Path

    def run(self, targets: Sequence[str], replaced: Mapping[str, str] | None = None, seed: int = 0) -> Report:
        work = Path(tempfile.mkdtemp(dir=self.scratch))
        try:
            tree = work / "wt"
            shutil.copytree(self.real, tree)
            for rel, text in (replaced or {}).items():
                (tree / rel).write_text(text, encoding="utf-8")
            report = work / "report.json"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
            env |= {
                "PYTHONPATH": os.pathsep.join([str(self.harness), str(tree), str(tree / "src")]),
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": str(seed),
                "LANES_SANDBOX_REPORT": str(report),
                "TMPDIR": str(work),
                "HOME": str(work),
            }
            argv = [sys.executable, *PYTEST_ARGS, "--rootdir", str(tree), "--", *targets]
            try:
                subprocess.run(
                    argv, cwd=tree, env=env, capture_output=True, timeout=RUN_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired:
                return Report(outcomes={}, collect_errors=["timeout"])
            if not report.is_file():
                return Report(outcomes={}, collect_errors=["no report"])
            data = json.loads(report.read_text(encoding="utf-8"))
            errors = [str(e.get("nodeid")) for e in data.get("errors", []) if e.get("when") == "collect"]
            return Report(outcomes=dict(data.get("tests", {})), collect_errors=errors)
        finally:
            shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Report:
    outcomes: dict[str, str]
    collect_errors: list[str]

    def passed(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}


def gutted(source: str, symbol: Symbol) -> str:
    """The module with the function's body replaced by `raise NotImplementedError` (signature, decorators
    and docstring kept): holdout_rules.mask's `...` marker, turned into a raise."""
    masked = mask(source, [symbol])
    if masked == source:
        return source  # no body (a docstring alone): nothing to gut
    return masked.replace("...  # held out", GUTTED, 1)


def definition_of(sources: Mapping[str, ast.Module], node_id: str) -> ast.AST | None:
    """The test's definition (a function, or a method of a test class) for a node id; None if not found."""
    path, *names = node_id.split("[", 1)[0].split("::")
    scope: ast.AST | None = sources.get(path)
    for name in names:
        body = getattr(scope, "body", [])
        scope = next(
            (n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name),
            None,
        )
    return scope


def names_function(sources: Mapping[str, ast.Module], node_id: str, name: str) -> bool:
    """Whether the test's code names the function: one of its own tests, not one that reaches it through
    another function."""
    found = definition_of(sources, node_id)
    return found is not None and name in names_in(found)


def choose_tests(judges: Sequence[str], name: str, sources: Mapping[str, ast.Module]) -> list[str]:
    """At most MAX_TESTS of the judging tests: those whose code names the function first, spread over the
    test functions round-robin (a parametrized test must not fill the list alone); sorted. Pure."""
    groups: dict[str, list[str]] = {}
    for node in sorted(judges):
        groups.setdefault(node.split("[", 1)[0], []).append(node)
    own = {g for g in groups if names_function(sources, g, name)}
    chosen: list[str] = []
    for tier in (sorted(own), sorted(set(groups) - own)):
        queues = [list(groups[g]) for g in tier]
        while queues and len(chosen) < MAX_TESTS:
            for queue in queues:
                if queue and len(chosen) < MAX_TESTS:
                    chosen.append(queue.pop(0))
            queues = [q for q in queues if q]
    return sorted(chosen)


def build_package(
    source: Source, folder: Path, work: Path, jobs: int, excluded_names: set[str]
) -> tuple[AnchorPackage, list[AnchorTask], dict[str, str]]:
    """The package's manifest entry, its tasks and why each other candidate is none."""
    sdist = f"{source.name}-{source.version}.tar.gz"
    digest = hashlib.sha256((folder / sdist).read_bytes()).hexdigest()
    package = AnchorPackage(
        name=source.name,
        version=source.version,
        sdist=sdist,
        sha256=digest,
        licence=source.licence,
        omit=dict(source.omit),
    )
    location, commit = package_repo(package, work, folder)
    real = work / f"{package.folder_name}-tree"
    shutil.rmtree(real, ignore_errors=True)
    export_commit(location, commit, real)
    harness = work / "harness"
    harness.mkdir(exist_ok=True)
    (harness / "lanes_sandbox_report.py").write_text(REPORT_PLUGIN, encoding="utf-8")
    runner = Runner(real=real, scratch=work, harness=harness)
    found = symbols_at(location, commit)
    tests = list(source.tests)
    missing = [t for t in tests if not (real / t).is_file()]
    if missing:
        raise SystemExit(f"{source.name}: test modules not in the sdist: {missing}")
    test_asts = {t: ast.parse((real / t).read_text(encoding="utf-8")) for t in tests}

    baseline = (runner.run(tests, seed=0).passed() & runner.run(tests, seed=1).passed()) - set(
        source.deselect
    )
    print(f"{source.name}: {len(baseline)} tests pass on the real code", flush=True)
    left_out: dict[str, str] = {}
    candidates = []
    for symbol in found.symbols:
        if symbol.path not in source.modules or symbol.kind != "function":
            continue
        if symbol.name.startswith("_"):
            left_out[symbol.id] = "private"
        elif symbol.name in excluded_names:
            left_out[symbol.id] = "a HumanEval problem's name"
        else:
            candidates.append(symbol)

    def judge(symbol: Symbol) -> AnchorTask | str:
        module = (real / symbol.path).read_text(encoding="utf-8")
        broken = gutted(module, symbol)
        if broken == module:
            return "no body to gut"
        full = runner.run(tests, {symbol.path: broken})
        if full.collect_errors:
            return f"gutting it breaks the collection of {full.collect_errors[0]}"
        judges = sorted(baseline - full.passed())
        if not judges:
            return "no test fails when it is gutted"
        if not any(names_function(test_asts, node, symbol.name) for node in judges):
            return "only tests of other functions fail when it is gutted: it has no tests of its own"
        chosen = choose_tests(judges, symbol.name, test_asts)
        alone = runner.run(chosen).outcomes
        chosen = [t for t in chosen if alone.get(t) == "passed"]  # order-dependent ones are left out
        if not chosen:
            return "its tests do not pass when run alone"
        if runner.run(chosen, {symbol.path: broken}).passed() >= set(chosen):
            return "its tests, run alone, pass when it is gutted"
        return AnchorTask(package=source.name, path=symbol.path, symbol=symbol.id, tests=chosen)

    tasks = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for symbol, result in zip(candidates, pool.map(judge, candidates), strict=True):
            if isinstance(result, AnchorTask):
                tasks.append(result)
            else:
                left_out[symbol.id] = result
    print(f"{source.name}: {len(tasks)} tasks of {len(candidates)} candidates", flush=True)
    return package, tasks, left_out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="test runs at once")
    parser.add_argument("--folder", type=Path, default=PACKAGES_DIR, help="the vendored sdists")
    args = parser.parse_args(argv)
    humaneval = {p.entry_point for p in load_problems()}
    packages, tasks, left_out = [], [], {}
    with tempfile.TemporaryDirectory(prefix="anchor-build-") as scratch:
        for source in SOURCES:
            package, found, skipped = build_package(source, args.folder, Path(scratch), args.jobs, humaneval)
            packages.append(package)
            tasks += found
            left_out |= {f"{source.name}:{k}": v for k, v in skipped.items()}
    manifest = AnchorManifest(
        built_with=f"Python {sys.version.split()[0]}, pytest {version('pytest')}",
        packages=packages,
        tasks=sorted(tasks, key=lambda t: (t.package, t.symbol)),
        left_out=dict(sorted(left_out.items())),
    )
    target = args.folder / MANIFEST_FILE
    target.write_text(manifest.model_dump_json(indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target}: {len(tasks)} tasks of {len(packages)} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
