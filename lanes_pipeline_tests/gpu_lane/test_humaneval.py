"""The forgetting guard: HumanEval problems load from the installed package, the daily subset is stable,
answers of both shapes become programs, and the programs run in the sandbox: right answers pass, wrong,
hanging and escaping ones fail. The last test asks the real vLLM server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lanes_pipeline.config.models import ExecutedEvalConfig
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.humaneval import (
    HumanEvalProblem,
    daily_subset,
    humaneval_pass1,
    humaneval_task,
    judge,
    judge_all,
    load_problems,
    program,
)
from lanes_pipeline.sandbox.isolation import Isolation, detect_isolation
from lanes_pipeline.settings import SandboxLimits, Settings

LIMITS = SandboxLimits(timeout_s=5, memory_mb=768)


@pytest.fixture(scope="module")
def problems() -> list[HumanEvalProblem]:
    return load_problems()


@pytest.fixture(scope="module")
def by_id(problems: list[HumanEvalProblem]) -> dict[str, HumanEvalProblem]:
    return {p.task_id: p for p in problems}


@pytest.fixture(scope="module")
def isolation() -> Isolation:
    return detect_isolation()


@pytest.fixture
def outside() -> Iterator[Path]:
    """A path outside the sandbox that an answer aims at; it must never appear."""
    target = Path("/tmp") / f"lanes-humaneval-escape-{uuid.uuid4().hex}"
    yield target
    assert not target.exists(), "the sandbox let a write out"


def full_function(problem: HumanEvalProblem) -> str:
    """The canonical solution as a model answers: the whole function in a fenced block, with chatter."""
    own = problem.prompt.index(f"def {problem.entry_point}")
    return f"Sure:\n```python\n{problem.prompt[own:]}{problem.canonical_solution}```\nThis works."


def test_problems_load_from_the_installed_package(problems: list[HumanEvalProblem]) -> None:
    assert len(problems) == 164
    assert [p.task_id for p in problems[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert problems[0].entry_point == "has_close_elements" and "def check(candidate)" in problems[0].test


def test_a_missing_or_bad_data_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "HumanEval.jsonl.gz"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_problems(missing)
    import gzip

    with gzip.open(missing, "wt", encoding="utf-8") as handle:
        handle.write('{"task_id": "HumanEval/0"}\n')
    with pytest.raises(ValueError, match=rf"{missing}, line 1"):
        load_problems(missing)


def test_the_daily_subset_is_stable_sized_and_order_free(problems: list[HumanEvalProblem]) -> None:
    first = daily_subset(problems, 40)
    assert len(first) == 40 and len({p.task_id for p in first}) == 40
    assert [p.task_id for p in daily_subset(list(reversed(problems)), 40)] == [p.task_id for p in first]
    assert [p.task_id for p in daily_subset(problems, 10)] == [p.task_id for p in first[:10]]
    assert [p.task_id for p in first[:3]] != ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert daily_subset(problems, None) == problems
    assert len(daily_subset(problems, 500)) == 164
    with pytest.raises(ValueError, match="at least 1"):
        daily_subset(problems, 0)


def test_the_task_shows_the_prompt_code_and_asks_for_the_function(by_id: dict[str, HumanEvalProblem]) -> None:
    problem = by_id["HumanEval/2"]
    task = humaneval_task(problem, "You are a careful engineer.")
    assert task.name == "HumanEval/2" and task.system == "You are a careful engineer."
    assert f"```python\n{problem.prompt}" in task.prompt and "whole function" in task.prompt


def test_program_takes_a_whole_function_after_the_prompts_imports_and_helpers(
    by_id: dict[str, HumanEvalProblem],
) -> None:
    problem = by_id["HumanEval/10"]  # a helper (is_palindrome) precedes the entry point
    code = program(problem, full_function(problem))
    assert code.count("def make_palindrome(") == 1 and code.count("def is_palindrome(") == 1
    assert code.index("def is_palindrome(") < code.index("def make_palindrome(")
    assert "Sure:" not in code and "This works." not in code
    assert code.rstrip().endswith("check(make_palindrome)") and "def check(candidate)" in code


def test_program_continues_the_prompt_with_a_body(by_id: dict[str, HumanEvalProblem]) -> None:
    problem = by_id["HumanEval/2"]
    assert program(problem, problem.canonical_solution).startswith(
        problem.prompt + problem.canonical_solution
    )
    dedented = program(problem, "```python\nreturn number % 1.0\n```")
    assert problem.prompt + "    return number % 1.0\n" in dedented


FIVE = ["HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/2"]


def test_canonical_solutions_pass_in_the_sandbox_in_both_shapes(
    by_id: dict[str, HumanEvalProblem], isolation: Isolation
) -> None:
    items = [(by_id[t], by_id[t].canonical_solution) for t in FIVE]
    items += [(by_id[t], full_function(by_id[t])) for t in FIVE]
    outcomes = judge_all(items, LIMITS, isolation)
    assert [o.name for o in outcomes] == FIVE + FIVE
    assert all(o.passed for o in outcomes), [o for o in outcomes if not o.passed]
    assert outcomes[0].reason.startswith("passed in")


def test_wrong_and_broken_answers_fail(by_id: dict[str, HumanEvalProblem], isolation: Isolation) -> None:
    problem = by_id["HumanEval/2"]
    wrong = judge(
        problem, "```python\ndef truncate_number(number):\n    return number\n```", LIMITS, isolation
    )
    assert not wrong.passed and "AssertionError" in wrong.reason
    broken = judge(problem, "```python\ndef truncate_number(number:\n    return\n```", LIMITS, isolation)
    assert not broken.passed and "SyntaxError" in broken.reason


def test_a_hang_is_killed_at_the_limit_and_the_next_program_still_runs(
    by_id: dict[str, HumanEvalProblem], isolation: Isolation
) -> None:
    problem = by_id["HumanEval/2"]
    limits = LIMITS.model_copy(update={"timeout_s": 2})
    hang = "```python\ndef truncate_number(number):\n    while True:\n        pass\n```"
    started = time.monotonic()
    outcomes = judge_all([(problem, hang), (problem, problem.canonical_solution)], limits, isolation)
    assert time.monotonic() - started < 2 + 4
    assert outcomes[0].model_dump() == {"name": "HumanEval/2", "passed": False, "reason": "timeout"}
    assert outcomes[1].passed


def test_answers_that_escape_fail_and_leave_nothing_behind(
    by_id: dict[str, HumanEvalProblem], isolation: Isolation, outside: Path
) -> None:
    problem = by_id["HumanEval/2"]
    writes = (
        f"```python\ndef truncate_number(number):\n    open({str(outside)!r}, 'w').write('x')\n"
        "    return number % 1.0\n```"
    )
    connects = (
        "```python\nimport socket\n\ndef truncate_number(number):\n"
        "    socket.create_connection(('93.184.216.34', 80), timeout=3)\n    return number % 1.0\n```"
    )
    # The third answer plants a module named like the standard library; the fourth program must not see it.
    plants = (
        "```python\ndef truncate_number(number):\n"
        "    open('fractions.py', 'w').write('raise SystemExit(3)')\n    return number % 1.0\n```"
    )
    needs_module = by_id["HumanEval/0"]
    uses_module = full_function(needs_module).replace("```python\n", "```python\nimport fractions\n", 1)
    outcomes = judge_all(
        [(problem, writes), (problem, connects), (problem, plants), (needs_module, uses_module)],
        LIMITS,
        isolation,
    )
    assert not outcomes[0].passed and "Read-only file system" in outcomes[0].reason
    assert not outcomes[1].passed and "unreachable" in outcomes[1].reason.lower()
    assert outcomes[2].passed and outcomes[3].passed


def test_pass1_of_the_base_model_through_vllm(
    gpu_server: EmbeddedServer, settings: Settings, problems: list[HumanEvalProblem]
) -> None:
    chosen = daily_subset(problems, 3)
    config = ExecutedEvalConfig(max_tokens=160, workers=3, timeout_s=10)
    base = settings.lanes.gpu_lane.served_model_name
    with VllmClient(gpu_server.url, timeout_s=300) as client:
        rate = humaneval_pass1(client, base, chosen, config, LIMITS, "You are a careful software engineer.")
    assert rate.model == base and rate.total == 3 and 0 <= rate.rate <= 1
    assert [o.name for o in rate.outcomes] == [p.task_id for p in chosen]
    assert rate.passed == sum(o.passed for o in rate.outcomes)
    assert all(o.reason for o in rate.outcomes)
