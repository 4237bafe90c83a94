"""The documents stay what their readers need: README.md a user's guide of at most 250 lines whose prose
carries no commit hashes (history lives in git, measurements in docs/benchmarks.md, written by a command),
and every file a document links to exists."""

from __future__ import annotations

import re

import pytest

from lanes_pipeline.bench.report import DOCS_COMMAND
from lanes_pipeline.settings import project_root

ROOT = project_root()
DOCUMENTS = [
    "README.md",
    "ARCHITECTURE.md",
    "docs/servers.md",
    "docs/operations.md",
    "docs/benchmarks.md",
    "docs/review.md",
    "docs/editors.md",
]
# A word of 7-40 hex digits with at least one digit and one letter: what a commit hash looks like.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a sample of what a command prints may name a commit)."""
    return "\n".join(part for n, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if n % 2 == 0)


def test_the_readme_is_a_guide_of_at_most_250_lines() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for section in ("## The two commands", "## What you get, and where", "## Troubleshooting"):
        assert section in readme
    assert "lanes-current" in readme and "http://127.0.0.1:8000/v1" in readme  # what to give an editor
    assert "**Python** repositories only" in readme


@pytest.mark.parametrize("document", DOCUMENTS)
def test_documents_name_no_commit_and_link_only_to_files_that_exist(document: str) -> None:
    text = (ROOT / document).read_text()
    assert COMMIT_HASH.findall(prose(text)) == []
    missing = [
        link
        for link in LINK.findall(text)
        if "://" not in link and not (ROOT / document).parent.joinpath(link).exists()
    ]
    assert missing == []


def test_the_commit_pattern_finds_a_hash_in_prose_and_not_in_a_sample() -> None:
    assert COMMIT_HASH.findall(prose("measured at 76341d8 on 2 cores\n```\nsample@3f1c2a9\n```\n")) == [
        "76341d8"
    ]
    assert COMMIT_HASH.findall("a decade, 1234567 rows, deadbeef") == []


def test_docs_benchmarks_md_is_written_by_its_command() -> None:
    assert f"Written by `{DOCS_COMMAND}`" in (ROOT / "docs" / "benchmarks.md").read_text()
