"""Completion rows: the repository's own code as the continuation an editor asks the GPU lane for.

The judge scores the served model on continuing held-out functions from a cut (completion_points.py);
these rows teach that very task on the functions the day teaches: the file's text before a cut inside the
function, in exactly the prompt an editor sends (`contract.completion_prompt`), answered with the lines
that follow (`contract.completion_continuation`: the newline the prompt stops before comes first).
Held-out bodies above the cut are masked as in every training row; a held-out function's own rows go to
the eval split (holdout_rules.route). Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from lanes_pipeline.dataset.completion_points import cut_points
from lanes_pipeline.dataset.contract import completion_continuation, completion_prompt
from lanes_pipeline.dataset.holdout_rules import mask
from lanes_pipeline.dataset.writer import Candidate
from lanes_pipeline.repos.symbols import Symbol


def spread(count: int, wanted: int) -> list[int]:
    """`wanted` indexes of `count` items, evenly spread from the first to the last (all when fewer)."""
    if wanted >= count:
        return list(range(count))
    if wanted == 1:
        return [0]
    return sorted({round(i * (count - 1) / (wanted - 1)) for i in range(wanted)})


def completion_rows(
    repo: str,
    symbol: Symbol,
    source: str,
    held: Sequence[Symbol],
    context_chars: int,
    cuts: int,
    lines: int,
) -> list[Candidate]:
    """Up to `cuts` rows of one function in its file's text `source`: cut before a line worth predicting
    (spread over the body), the prompt the file's text before the cut (held-out bodies masked, cut from
    the left to `context_chars`), the answer the next `lines` lines of the function."""
    points = cut_points(repo, symbol.path, source, symbol)
    file_lines = source.splitlines(keepends=True)
    rows = []
    for index in spread(len(points), cuts):
        point = points[index]
        above = [h for h in held if h.path == symbol.path and h.end_line < point.line]
        prefix = mask("".join(file_lines[: point.line - 1]), above)
        answer = "".join(file_lines[point.line - 1 : min(point.line - 1 + lines, symbol.end_line)])
        rows.append(
            Candidate(
                task="complete",
                repo=repo,
                path=symbol.path,
                code=completion_prompt(symbol.path, prefix, context_chars),
                answer=completion_continuation(answer),
                symbol=symbol.name,
                code_is_file=False,
            )
        )
    return rows
