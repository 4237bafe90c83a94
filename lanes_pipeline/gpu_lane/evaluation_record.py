"""The day's evaluation as files, and how people read it: `adapter_evaluation/<day>/answers.json` (every
answer of every model judged, with its verdict) beside `evaluation.json` (figures, comparisons and the
decision). The paired outcome table is what the asset's metadata shows and `lanes report --day D` prints,
with the tasks whose outcome changed and both answers. Pure apart from reading and writing the store.
"""

from __future__ import annotations

from datetime import date
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from lanes_pipeline.gpu_lane.judged import EvalLoss, TaskAnswer
from lanes_pipeline.gpu_lane.promotion import FIGURES, Decision, Scores, figure_scores
from lanes_pipeline.store import ArtifactStore

if TYPE_CHECKING:  # only for the annotation: this module stays free of the lanes' I/O
    from lanes_pipeline.gpu_lane.measurement import Measured

EVALUATION_ASSET = "adapter_evaluation"
ANSWERS_FILE, EVALUATION_FILE = "answers.json", "evaluation.json"


class ModelAnswers(BaseModel):
    model: str
    task_sets: dict[str, list[TaskAnswer]]
    eval_loss: EvalLoss | None = None


class DayAnswers(BaseModel):
    """answers.json: per label (base, current, candidate), the served model and its answers."""

    day: date
    candidate: str
    current: str | None = None
    labels: dict[str, ModelAnswers]

    def scores(self) -> dict[str, Scores]:
        return {
            label: figure_scores(m.task_sets, m.eval_loss.row_losses if m.eval_loss else {})
            for label, m in self.labels.items()
        }


def write_answers(store: ArtifactStore, day: date, measured: Measured) -> None:
    """The day's answers.json from what was measured."""
    record = DayAnswers(
        day=day,
        candidate=measured.models["candidate"],
        current=measured.current,
        labels={
            label: ModelAnswers(
                model=model,
                task_sets=measured.answers.get(label, {}),
                eval_loss=measured.losses.get(label),
            )
            for label, model in measured.models.items()
        },
    )
    store.write_json(EVALUATION_ASSET, day.isoformat(), ANSWERS_FILE, record.model_dump(mode="json"))


class EvaluationRecordError(ValueError):
    """A day's answers.json that is missing or unreadable; the message names the file."""


def read_answers(store: ArtifactStore, day: str) -> DayAnswers:
    path = store.folder(EVALUATION_ASSET, day) / ANSWERS_FILE
    if not path.is_file():
        raise EvaluationRecordError(
            f"{path} does not exist: no candidate was judged on {day} (no adapter that day, or "
            "adapter_evaluation has not run for it)"
        )
    try:
        return DayAnswers.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise EvaluationRecordError(f"{path}: not a day's answers: {exc}") from None


def read_decision(store: ArtifactStore, day: str) -> Decision:
    path = store.folder(EVALUATION_ASSET, day) / EVALUATION_FILE
    try:
        return Decision.model_validate(store.read_json(EVALUATION_ASSET, day, EVALUATION_FILE)["decision"])
    except (OSError, KeyError, ValueError) as exc:
        raise EvaluationRecordError(f"{path}: no readable decision: {exc}") from None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def paired_table(decision: Decision) -> str:
    """One row per figure and reference: n, wins, losses, ties, both means, the difference with its 95%
    interval and the one-sided p-values (Markdown)."""
    lines = [
        "| figure | vs | n | wins | losses | ties | candidate | reference | difference [95% interval] "
        "| p better | p worse | test |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in decision.comparisons:
        role = " (primary)" if c.figure == decision.primary else ""
        lines.append(
            f"| {c.figure}{role} | {c.against} | {c.n} | {c.wins} | {c.losses} | {c.ties} | "
            f"{c.candidate:.4f} | {c.reference:.4f} | {c.difference:+.4f} "
            f"[{c.interval[0]:+.4f}, {c.interval[1]:+.4f}] | {c.p_better:.4g} | {c.p_worse:.4g} | {c.test} |"
        )
    return "\n".join(lines)


def _shorten(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text) - limit} more characters)"


def changed_tasks(record: DayAnswers, against: str, limit: int = 600) -> list[str]:
    """Markdown of each task whose score changed between `against` and the candidate: the task, both
    verdicts and both answers (each cut at `limit` characters)."""
    if against not in record.labels:
        return []
    mine, theirs = record.labels["candidate"], record.labels[against]
    out = []
    for task_set, answers in mine.task_sets.items():
        score = next((spec.score for spec in FIGURES.values() if spec.task_set == task_set), None)
        others = {a.task: a for a in theirs.task_sets.get(task_set, [])}
        for answer in answers:
            other = others.get(answer.task)
            if other is None or score is None:
                continue
            before, after = other.scores.get(score), answer.scores.get(score)
            if before is None or after is None or abs(before - after) < 1e-9:
                continue
            word = "won" if after > before else "lost"
            out.append(
                f"### {task_set} {answer.task}: candidate {word} ({score} {before:g} -> {after:g})\n"
                f"{against} ({theirs.model}): {_cell(other.reason)}; {other.tokens} tokens, finish "
                f"{other.finish_reason}\n```\n{_shorten(other.answer, limit)}\n```\n"
                f"candidate ({mine.model}): {_cell(answer.reason)}; {answer.tokens} tokens, finish "
                f"{answer.finish_reason}\n```\n{_shorten(answer.answer, limit)}\n```"
            )
    return out


def day_report(store: ArtifactStore, day: str) -> str:
    """`lanes report --day D`: the decision, the paired outcome table and the changed tasks."""
    record, decision = read_answers(store, day), read_decision(store, day)
    verdict = "promoted" if decision.promote else "not promoted"
    parts = [
        f"# {day}: {record.candidate} {verdict}",
        "\n".join(f"- {reason}" for reason in decision.reasons),
        "## Paired outcome\n\n" + paired_table(decision),
    ]
    for against in ("base", "current"):
        changed = changed_tasks(record, against)
        if against in record.labels:
            title = f"## Tasks whose outcome changed against {against} ({record.labels[against].model})"
            parts.append(title + f": {len(changed)}\n\n" + ("\n\n".join(changed) or "none"))
    return "\n\n".join(parts) + "\n"
