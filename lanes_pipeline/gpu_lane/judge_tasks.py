"""The day's task sets and how one model answers them: asked through vLLM, judged (executed in the sandbox,
or scored line by line), every answer kept.

Task sets (issue 27):
- `repo`: the held-out functions of the configured repositories (held_out_tasks' held_out.json), executed;
- `anchor`: the fixed anchor set of real packages nobody here wrote (anchor_set.py), executed, the same
  tasks every day, in exactly the repository task's prompt;
- `humaneval`: the forgetting guard, executed;
- `completion`: the editor's figure, held-out next lines continued through the completions endpoint.
A model answers a task once (answer_cache.py); an answer already judged for the same task takes that
verdict. An answer that hangs, prints forever or escapes fails its task in the sandbox; it never stops
the day.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lanes_pipeline.config.models import ExecutedEvalConfig
from lanes_pipeline.dataset.completion_points import CompletionPoint
from lanes_pipeline.dataset.contract import completion_prompt
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction
from lanes_pipeline.gpu_lane.answer_cache import AnswerCache, task_key
from lanes_pipeline.gpu_lane.code_tasks import LOOP_STOP, CodeTask, answers, judged
from lanes_pipeline.gpu_lane.completion import completion_answers, point_prefix
from lanes_pipeline.gpu_lane.humaneval import HumanEvalProblem, humaneval_task, judge_all
from lanes_pipeline.gpu_lane.judged import Answer, TaskAnswer, TaskSet
from lanes_pipeline.gpu_lane.repo_tasks import body_task, judge_body
from lanes_pipeline.http import OpenAIClient
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import canonical_json, sha256_bytes


@dataclass(frozen=True)
class DayTasks:
    """Every task a day's candidate is judged on, with what asking and judging them needs."""

    repo: list[HeldOutFunction]
    anchor: list[HeldOutFunction]
    problems: list[HumanEvalProblem]
    points: list[CompletionPoint]
    sources: dict[str, dict[str, str]]
    system_prompt: str
    limits: SandboxLimits
    not_tasks: dict[str, str] = field(default_factory=dict)  # task name -> why it is not a task

    def sizes(self) -> dict[str, int]:
        return {
            "repo": len(self.repo),
            "anchor": len(self.anchor),
            "humaneval": len(self.problems),
            "completion": len(self.points),
        }

    def fingerprint(self) -> str:
        names = {
            "repo": [f.repo + f.symbol.id + f.commit for f in self.repo],
            "anchor": [f.repo + f.symbol.id + f.commit for f in self.anchor],
            "humaneval": [p.task_id for p in self.problems],
            "completion": [p.id for p in self.points],
        }
        return sha256_bytes(canonical_json(names))[:16]


Verdicts = dict[tuple[str, str], TaskAnswer]


def _reused(task: str, answer: Answer, prior: TaskAnswer) -> TaskAnswer:
    return TaskAnswer.of(task, answer, dict(prior.scores), prior.reason)


@dataclass(frozen=True)
class TaskSetPlan:
    """One task set as a model answers it: each task's id and cache key, and how to answer some of them
    (indices into the ids) for one served model name."""

    name: TaskSet
    ids: list[str]
    keys: list[str]
    # (client, served model name, indices to answer, verdicts known by (key, answer text)) -> answers
    answer: Callable[[OpenAIClient, str, list[int], Verdicts], dict[int, TaskAnswer]]


def _body_plan(
    name: TaskSet, functions: Sequence[HeldOutFunction], tasks: DayTasks, config: ExecutedEvalConfig
) -> TaskSetPlan:
    asked = [body_task(f, tasks.system_prompt) for f in functions]
    keys = [
        task_key(
            task.name,
            {
                "system": task.system,
                "prompt": task.prompt,
                "commit": f.commit,
                "tests": f.repo_tests,
                "cpu_tests": f.cpu_tests,
                "max_tokens": config.max_tokens,
                **_loop_rule(config),
            },
        )
        for task, f in zip(asked, functions, strict=True)
    ]

    def answer(client: OpenAIClient, model: str, wanted: list[int], known: Verdicts) -> dict[int, TaskAnswer]:
        out = {}
        for i, given in zip(wanted, _ask(client, model, asked, wanted, config), strict=True):
            prior = known.get((keys[i], given.text))
            if prior is not None:
                out[i] = _reused(asked[i].name, given, prior)
            else:
                out[i] = judged(judge_body(functions[i], given.text, tasks.limits), given)
        return out

    return TaskSetPlan(name, [t.name for t in asked], keys, answer)


def _humaneval_plan(tasks: DayTasks, config: ExecutedEvalConfig) -> TaskSetPlan:
    asked: list[CodeTask] = [humaneval_task(p, tasks.system_prompt) for p in tasks.problems]
    keys = [
        task_key(
            t.name,
            {"system": t.system, "prompt": t.prompt, "max_tokens": config.max_tokens, **_loop_rule(config)},
        )
        for t in asked
    ]

    def answer(client: OpenAIClient, model: str, wanted: list[int], known: Verdicts) -> dict[int, TaskAnswer]:
        said = {i: given for i, given in zip(wanted, _ask(client, model, asked, wanted, config), strict=True)}
        priors = {i: known.get((keys[i], said[i].text)) for i in wanted}
        out = {i: _reused(asked[i].name, said[i], p) for i, p in priors.items() if p is not None}
        todo = [i for i in wanted if i not in out]
        runs = judge_all([(tasks.problems[i], said[i].text) for i in todo], tasks.limits)
        return out | {i: judged(run, said[i]) for i, run in zip(todo, runs, strict=True)}

    return TaskSetPlan("humaneval", [t.name for t in asked], keys, answer)


def _completion_plan(tasks: DayTasks, config: ExecutedEvalConfig) -> TaskSetPlan:
    points = tasks.points
    keys = [
        task_key(
            p.id,
            {
                "prompt": completion_prompt(
                    p.path, point_prefix(p, tasks.sources), config.completion_context_chars
                ),
                "expected": p.expected,
                "max_tokens": config.completion_max_tokens,
            },
        )
        for p in points
    ]

    def answer(client: OpenAIClient, model: str, wanted: list[int], known: Verdicts) -> dict[int, TaskAnswer]:
        said = completion_answers(
            client,
            model,
            [points[i] for i in wanted],
            tasks.sources,
            config.completion_context_chars,
            config.completion_max_tokens,
            config.workers,
        )
        return dict(zip(wanted, said, strict=True))

    return TaskSetPlan("completion", [p.id for p in points], keys, answer)


def _loop_rule(config: ExecutedEvalConfig) -> dict[str, object]:
    """What a cached answer was asked with beyond the prompt: the loop stop when on (keys of answers asked
    without it stay as they were)."""
    return {"stop_loops": LOOP_STOP} if config.stop_loops else {}


def _ask(
    client: OpenAIClient, model: str, asked: Sequence[CodeTask], wanted: list[int], config: ExecutedEvalConfig
) -> list[Answer]:
    said = answers(
        client, model, [asked[i] for i in wanted], config.max_tokens, config.workers, config.stop_loops
    )
    return [said[asked[i].name] for i in wanted]


def plans(tasks: DayTasks, config: ExecutedEvalConfig) -> list[TaskSetPlan]:
    return [
        _body_plan("repo", tasks.repo, tasks, config),
        _body_plan("anchor", tasks.anchor, tasks, config),
        _humaneval_plan(tasks, config),
        _completion_plan(tasks, config),
    ]


@dataclass
class Answered:
    """One model's answers per task set, and how many it was asked (the rest came from the cache)."""

    answers: dict[str, list[TaskAnswer]]
    asked: dict[str, int]


def answer_all(
    client: OpenAIClient, model: str, cache_as: str, plan_list: Sequence[TaskSetPlan], cache: AnswerCache
) -> Answered:
    """Every task of every set answered by the served `model`: from the cache (under `cache_as`, the
    model's identity) where it answered before, else asked and judged (an identical answer judged before
    takes that verdict) and cached."""
    result: dict[str, list[TaskAnswer]] = {}
    asked: dict[str, int] = {}
    for plan in plan_list:
        known = cache.load(cache_as, plan.name)
        missing = [i for i, key in enumerate(plan.keys) if key not in known]
        fresh: dict[str, TaskAnswer] = {}
        if missing:
            verdicts = cache.verdicts(plan.name, [plan.keys[i] for i in missing])
            for i, given in plan.answer(client, model, missing, verdicts).items():
                fresh[plan.keys[i]] = given
            cache.save(cache_as, plan.name, fresh)
        known |= fresh
        result[plan.name] = [known[key] for key in plan.keys]
        asked[plan.name] = len(missing)
    return Answered(result, asked)
