"""The editor's figure: held-out code completion, scored as CrossCodeEval and RepoBench score it.

At each completion point of the day (dataset/completion_points.py) the served model continues the file
from the cut through the completions endpoint, the way an editor asks: greedy (temperature 0), up to
`completion_max_tokens` tokens, of which the first code line is scored. The prompt stops before the
newline that ends the line above the cut (`contract.completion_prompt` says why). The line it writes is
compared with the file's next line: exact match, and edit similarity (`rapidfuzz.fuzz.ratio` / 100, the
fuzzywuzzy ratio both benchmarks report), both on the lines stripped of surrounding whitespace so
indentation alone neither wins nor loses a point. The base model, the current adapter and the candidate
are asked the same points, so the figure compares like with like.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from rapidfuzz import fuzz

from lanes_pipeline.dataset.completion_points import CompletionPoint
from lanes_pipeline.dataset.contract import completion_prompt
from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, EXACT_MATCH, Answer, TaskAnswer
from lanes_pipeline.http import CompletionRequest, OpenAIClient

REASON_CHARS = 80  # of the expected line quoted in a miss's reason


def score_line(expected: str, got: str) -> dict[str, float]:
    """Exact match (1.0 / 0.0) and edit similarity in [0, 1] of the model's line against the file's."""
    want, have = expected.strip(), got.strip()
    return {
        EXACT_MATCH: 1.0 if want == have else 0.0,
        EDIT_SIMILARITY: round(fuzz.ratio(want, have) / 100, 4),
    }


def first_line(text: str) -> str:
    """The line of a continuation that is scored: its first line that is neither blank nor only a comment,
    as RepoBench takes it. A continuation begins with the newline the prompt stops before (the text before
    it, normally nothing, would extend the line above the cut), and small models may write a blank or
    commented-out line first; the next code line they write is the one an editor shows."""
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return line
    return ""


def point_prefix(point: CompletionPoint, sources: Mapping[str, Mapping[str, str]]) -> str:
    """The file's text before the point's line; refuses a point whose line is not the one in its file (a
    source from another commit would score the model against the wrong line)."""
    source = sources.get(point.repo, {}).get(point.path)
    if source is None:
        raise KeyError(f"completion point {point.id}: no source of {point.repo}: {point.path}")
    lines = source.splitlines(keepends=True)
    if point.line > len(lines) or lines[point.line - 1].rstrip("\r\n") != point.expected:
        raise ValueError(
            f"completion point {point.id}: line {point.line} of {point.repo}: {point.path} is not "
            f"{point.expected!r} (a source from another commit?)"
        )
    return "".join(lines[: point.line - 1])


def _quoted(text: str) -> str:
    text = text.strip()
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def reason(point: CompletionPoint, line: str, scores: Mapping[str, float]) -> str:
    """Short: `exact`, or the similarity, the line that was expected and the line that was scored."""
    if scores[EXACT_MATCH] == 1.0:
        return "exact"
    got = f"`{_quoted(line)}`" if line.strip() else "no code line"
    return f"similarity {scores[EDIT_SIMILARITY]:.2f}: expected `{_quoted(point.expected)}`, got {got}"


def ask_point(
    client: OpenAIClient,
    model: str,
    point: CompletionPoint,
    sources: Mapping[str, Mapping[str, str]],
    context_chars: int,
    max_tokens: int,
) -> TaskAnswer:
    """One point asked greedily for one line, and its verdict."""
    prompt = completion_prompt(point.path, point_prefix(point, sources), context_chars)
    request = CompletionRequest(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, seed=0)
    response = client.completion(request)
    finish = response.choices[0].finish_reason if response.choices else None
    # The whole continuation is kept (why a line was missed can be read from it); one line is scored.
    answer = Answer(text=response.text, tokens=response.usage.completion_tokens, finish_reason=finish)
    line = first_line(response.text)
    scores = score_line(point.expected, line)
    return TaskAnswer.of(point.id, answer, scores, reason(point, line, scores))


def completion_answers(
    client: OpenAIClient,
    model: str,
    points: Sequence[CompletionPoint],
    sources: Mapping[str, Mapping[str, str]],
    context_chars: int,
    max_tokens: int,
    workers: int,
) -> list[TaskAnswer]:
    """Each point's answer and scores, in the points' order; `workers` requests at once (vLLM batches
    them). `sources`: repo -> path -> the file's text at the day's commit (HeldOutDay.sources)."""
    if workers < 1:
        raise ValueError(f"completion answers: workers must be at least 1, got {workers}")
    if not points:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(points))) as pool:
        return list(
            pool.map(lambda p: ask_point(client, model, p, sources, context_chars, max_tokens), points)
        )
