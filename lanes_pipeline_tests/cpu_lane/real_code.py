"""Real packages nobody here wrote, from the PyPI source distributions kept in `real_code/` (see its README):
read in memory, no download, no unpacking."""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

from lanes_pipeline.repos.snapshot import is_test_path

SDISTS = Path(__file__).with_name("real_code")
PACKAGES = ("cachetools-5.5.0", "six-1.16.0", "async-timeout-4.0.3", "decorator-5.1.1")
# What a user's repository would not hand the CPU lane as code to work on.
_NOT_CODE = ("docs/", "doc/")


def sdist_files(package: str) -> dict[str, str]:
    """Every UTF-8 text file of the sdist, by its path inside the package's top folder."""
    files: dict[str, str] = {}
    with tarfile.open(SDISTS / f"{package}.tar.gz") as archive:
        for member in archive.getmembers():
            handle = archive.extractfile(member) if member.isfile() else None
            if handle is None:
                continue
            path = str(PurePosixPath(*PurePosixPath(member.name).parts[1:]))
            try:
                files[path] = handle.read().decode("utf-8")
            except UnicodeDecodeError:
                continue  # a binary file: not code, and not needed to run the package's tests
    return files


def package_sources(package: str) -> dict[str, str]:
    """The package's own Python modules (no tests, docs or setup.py): what the CPU lane works on."""
    return {
        path: text
        for path, text in sdist_files(package).items()
        if path.endswith(".py")
        and not is_test_path(path)
        and not path.startswith(_NOT_CODE)
        and path != "setup.py"
    }


SAMPLE = Path(__file__).parents[2] / "lanes_pipeline" / "repos" / "sample_repo"


def case_source(where: str) -> str:
    """The module a hand-labelled case names: `sample:<day>/<file>` (the shipped sample repository) or
    `<package-version>:<path in the sdist>`."""
    origin, path = where.split(":", 1)
    if origin == "sample":
        return (SAMPLE / path).read_text(encoding="utf-8")
    return package_sources(origin)[path]
