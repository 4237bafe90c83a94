"""Every answer kept (answers.json), asked once (answer_cache.py), and read back by `lanes report --day D`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.gpu_lane.answer_cache import AnswerCache, task_key
from lanes_pipeline.gpu_lane.evaluation_record import (
    EVALUATION_FILE,
    EvaluationRecordError,
    changed_tasks,
    day_report,
    read_answers,
    write_answers,
)
from lanes_pipeline.gpu_lane.judged import PASSED, EvalLoss, TaskAnswer
from lanes_pipeline.gpu_lane.promotion import paired_decision
from lanes_pipeline.store import ArtifactStore

DAY = date(2026, 11, 4)


def answered(task: str, passed: bool, text: str) -> TaskAnswer:
    reason = "2 test(s) passed" if passed else "1 test(s) failed: tests/test_m.py::test_x"
    return TaskAnswer(
        task=task, answer=text, tokens=7, finish_reason="stop", scores={PASSED: float(passed)}, reason=reason
    )


@dataclass
class Measured:  # what measurement.Measured gives write_answers
    models: dict[str, str]
    current: str | None
    answers: dict[str, dict[str, list[TaskAnswer]]]
    losses: dict[str, EvalLoss] = field(default_factory=dict)


def write_day(store: ArtifactStore) -> None:
    measured = Measured(
        models={"base": "smol", "candidate": "lanes-2026-11-04"},
        current=None,
        answers={
            "base": {
                "repo": [
                    answered("r:body:m.py::f", False, "def f(): pass"),
                    answered("r:body:m.py::g", True, "G"),
                ]
            },
            "candidate": {
                "repo": [
                    answered("r:body:m.py::f", True, "def f():\n    return 1"),
                    answered("r:body:m.py::g", True, "G"),
                ]
            },
        },
        losses={"base": EvalLoss(loss=1.5, by_kind={"write_body": 1.5})},
    )
    write_answers(store, DAY, measured)
    decision = paired_decision(
        read_answers(store, DAY.isoformat()).scores(), "repo_pass_rate", 0.05, {"humaneval_pass1": 0.02}
    )
    store.write_json(
        "adapter_evaluation", DAY.isoformat(), EVALUATION_FILE, {"decision": decision.model_dump(mode="json")}
    )


def test_the_day_report_shows_the_paired_outcome_and_each_changed_task_with_both_answers(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    write_day(store)
    record = read_answers(store, DAY.isoformat())
    assert record.labels["base"].eval_loss == EvalLoss(loss=1.5, by_kind={"write_body": 1.5})
    [changed] = changed_tasks(record, "base")
    assert "r:body:m.py::f: candidate won (passed 0 -> 1)" in changed
    assert "def f(): pass" in changed and "return 1" in changed and "tests/test_m.py::test_x" in changed
    text = day_report(store, DAY.isoformat())
    assert "# 2026-11-04: lanes-2026-11-04 not promoted" in text  # 1 win, 0 losses: p = 0.5
    assert "| repo_pass_rate (primary) | base | 2 | 1 | 0 | 1 |" in text
    assert "Tasks whose outcome changed against base (smol): 1" in text


def test_lanes_report_day_prints_it_and_names_a_day_without_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANES_DATA_DIR", str(tmp_path))
    write_day(ArtifactStore(tmp_path / "artifacts"))
    shown = CliRunner().invoke(main, ["report", "--day", DAY.isoformat()])
    assert shown.exit_code == 0, shown.output
    assert "Paired outcome" in shown.output and (tmp_path / "reports" / "evaluation-2026-11-04.md").is_file()
    missing = CliRunner().invoke(main, ["report", "--day", "2026-11-05"])
    assert missing.exit_code != 0 and "answers.json does not exist" in missing.output
    with pytest.raises(EvaluationRecordError, match="no candidate was judged on 2026-11-05"):
        read_answers(ArtifactStore(tmp_path / "artifacts"), "2026-11-05")


def test_the_cache_keeps_a_models_answers_by_task_and_shares_verdicts_of_identical_answers(
    tmp_path: Path,
) -> None:
    cache = AnswerCache(tmp_path / "answers")
    key = task_key("r:body:m.py::f", {"prompt": "write f", "max_tokens": 32})
    assert key != task_key(
        "r:body:m.py::f", {"prompt": "write f", "max_tokens": 64}
    )  # another setting, asked again
    assert cache.load("base", "repo") == {}
    cache.save("base", "repo", {key: answered("r:body:m.py::f", True, "def f(): return 1")})
    assert cache.load("base", "repo")[key].scores == {PASSED: 1.0}
    # the candidate wrote the same answer: the base's verdict is reused; another answer is not
    verdicts = cache.verdicts("repo", [key])
    assert ("def f(): return 1" in {text for _, text in verdicts}) and len(verdicts) == 1
    (tmp_path / "answers" / "base" / "repo.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"repo\.json: not a file of cached answers"):
        cache.load("base", "repo")
