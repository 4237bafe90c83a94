"""A refactor diff confined to one symbol's lines of its file (pure).

A symbol's refactor may change only that symbol: every removed line must be one of its lines, and every
added line must go between its first line and the line after its last. Hunk headers are not trusted:
`git apply` places a hunk wherever its context matches (an offset), so a hunk whose numbers claim the symbol
could land elsewhere. Each hunk is therefore located by its own lines (context and removed) in the file
as it is at the day's commit, nearest to the position it states, and the diff is rewritten with those
positions: what `git apply --check` then checks is exactly what was confined. A small model rarely gets the
numbers right; finding its hunk by content keeps such an answer usable without widening what it may touch.
"""

from __future__ import annotations

from collections.abc import Sequence

from unidiff import PatchSet, UnidiffParseError
from unidiff.patch import Hunk

from lanes_pipeline.cpu_lane.jobs.tasks import DiffRejection, ParsedDiff
from lanes_pipeline.repos.symbols import Symbol


def locate(lines: Sequence[str], block: Sequence[str], stated: int) -> int | None:
    """The 1-based line where `block` occurs in `lines`, nearest to `stated` (None: nowhere)."""
    size = len(block)
    found = [p + 1 for p in range(len(lines) - size + 1) if list(lines[p : p + size]) == list(block)]
    return min(found, key=lambda p: (abs(p - stated), p)) if found else None


def _source_side(hunk: Hunk) -> list[str]:
    return [line.value.rstrip("\r\n") for line in hunk if line.is_context or line.is_removed]


def _outside(hunk: Hunk, position: int, first: int, last: int) -> str | None:
    """Why a hunk placed at `position` changes a line outside `first..last` (None: it does not)."""
    current = position  # the file line the next context or removed line stands for
    for line in hunk:
        if line.is_context:
            current += 1
        elif line.is_removed:
            if not first <= current <= last:
                return f"removes line {current}, outside the symbol's lines {first}-{last}"
            current += 1
        elif line.is_added and not first < current <= last + 1:
            return f"adds a line before line {current}, outside the symbol's lines {first}-{last}"
    return None


def confine_to_symbol(
    diff: ParsedDiff, file_source: str, symbol: Symbol
) -> ParsedDiff | tuple[DiffRejection, str]:
    """`diff` (already parse_diff'ed for the symbol's file) with each hunk placed where its lines are in
    `file_source`, or why it cannot be confined to `symbol` (verdict `outside_symbol`)."""
    try:
        patch = PatchSet(diff.text)
    except UnidiffParseError as exc:  # parse_diff accepted it: only a changed unidiff could get here
        return "malformed_diff", str(exc)[:300]
    lines = file_source.splitlines()
    hunks = [hunk for patched in patch for hunk in patched]
    rendered: list[str] = []
    offset, next_free = 0, 1
    for hunk in hunks:
        block = _source_side(hunk)
        if not block:
            return "outside_symbol", "a hunk without context or removed lines cannot be placed"
        position = locate(lines, block, hunk.source_start)
        if position is None:
            return "outside_symbol", f"hunk @@ -{hunk.source_start} does not match the file's lines"
        if position < next_free:
            return "outside_symbol", f"hunk @@ -{hunk.source_start} overlaps the hunk before it"
        why = _outside(hunk, position, symbol.start_line, symbol.end_line)
        if why is not None:
            return "outside_symbol", why
        added = sum(line.is_added for line in hunk)
        removed = sum(line.is_removed for line in hunk)
        target = len(block) - removed + added
        rendered.append(f"@@ -{position},{len(block)} +{position + offset},{target} @@\n")
        rendered += [str(line) for line in hunk]
        offset += added - removed
        next_free = position + len(block)
    text = f"--- a/{diff.path}\n+++ b/{diff.path}\n" + "".join(rendered)
    return ParsedDiff(text=text, path=diff.path, added=diff.added, removed=diff.removed)


def apply_confined(diff: ParsedDiff, file_source: str) -> str:
    """`file_source` with a confined diff applied (its hunks' numbers are exact: confine_to_symbol placed
    them), for checks of the code the diff makes; `git apply` in the sandbox stays the one that counts."""
    lines = file_source.splitlines(keepends=True)
    result: list[str] = []
    cursor = 0
    for hunk in (hunk for patched in PatchSet(diff.text) for hunk in patched):
        start = max(hunk.source_start - 1, 0)
        result += lines[cursor:start]
        result += [line.value for line in hunk if line.is_added or line.is_context]
        cursor = start + hunk.source_length
    return "".join(result + lines[cursor:])
