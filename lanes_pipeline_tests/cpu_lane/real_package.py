"""A real package's releases as a dated git history, for the CPU-lane tests (issue 11, item 7).

The repository is built once per test session from the pinned sdists of lanes_pipeline.bench.real_package
(`decorator` 5.0.9, 5.1.0, 5.1.1: one module over the shipped max_file_bytes, a few symbols edited between
releases), downloaded through pip and its cache, one release per day at noon UTC from the pipeline's
start_date. A download that fails fails the tests that use it, naming the package and version.
"""

from __future__ import annotations

import pytest

from lanes_pipeline.bench.real_package import RealPackageError, ReleaseRepo, build_release_repo
from lanes_pipeline.settings import load_settings


@pytest.fixture(scope="session")
def real_package_repo(tmp_path_factory: pytest.TempPathFactory) -> ReleaseRepo:
    root = tmp_path_factory.mktemp("real_package")
    first_day = load_settings().pipeline.start_date
    try:
        return build_release_repo(root / "repo", root / "sdists", first_day)
    except RealPackageError as exc:
        pytest.fail(f"the real-package fixture could not be built: {exc}", pytrace=False)
