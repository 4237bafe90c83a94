"""A file whose only secrets are random-looking stays in the day; its values never reach a prompt."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

from lanes_pipeline.cpu_lane.jobs.prompts import PromptLayout
from lanes_pipeline.cpu_lane.jobs.tasks import SYMBOL_REFACTOR, symbol_prompt
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.snapshot import SelectionRules, take_snapshot

DIGEST = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of nothing
SOURCE = (
    f'def is_empty(digest: str = "{DIGEST}") -> bool:\n'
    f'    """True for the digest of no bytes."""\n'
    f'    return digest == "{DIGEST[:32]}" "{DIGEST[32:]}"\n'
)
RULES = SelectionRules(include=["**/*.py"], exclude=[], max_file_bytes=10_000)


def test_a_shapeless_finding_is_redacted_in_the_prompt_and_recorded_by_type(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    when = datetime(2026, 11, 2, 12, tzinfo=UTC)
    build_history(repo, [CommitSpec(when=when, message="one", files={"digests.py": SOURCE})])
    snapshot = take_snapshot("r", repo, "HEAD", date(2026, 11, 2), "UTC", RULES, 2000)

    # The file stays in the day; the snapshot names the types redacted, never the value.
    assert [f.path for f in snapshot.files] == ["digests.py"] and snapshot.left_out == []
    assert snapshot.redactions() == {"digests.py": ["Hex High Entropy String"] * 2}
    assert DIGEST not in snapshot.model_dump_json() and "def is_empty(" in snapshot.repo_map

    [symbol] = symbols_at(repo, snapshot.commit or "").symbols
    assert DIGEST in symbol.source  # the sandbox's bytes are the real ones
    request = PromptLayout(SYMBOL_REFACTOR, shared_context=snapshot.repo_map).build(
        "x", symbol_prompt(symbol)
    )
    prompt = "\n".join(m.content for m in request.messages)
    assert DIGEST not in prompt and DIGEST[:32] not in prompt and DIGEST[32:] not in prompt
    assert "<redacted:Hex High Entropy String>" in prompt
    assert "True for the digest of no bytes." in prompt and "def is_empty(" in prompt
