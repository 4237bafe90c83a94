"""The house rules a newcomer can rely on: at most 10 modules at the package root (the rest lives in a
folder per domain), and no module over 500 lines."""

from __future__ import annotations

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
