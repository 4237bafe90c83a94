"""`lanes cpu ask "..."` and `lanes cpu batch FILE.jsonl`: the CPU lane from a shell, through the same
resource (cache, slots, retries) the Dagster assets use.

A batch file has one JSON object per line, in one of three forms:

    {"id": "q1", "prompt": "What does `git rebase` do?"}                      # the `ask` task
    {"id": "q2", "task": "short_answer", "input": "Capital of France?"}        # a registered task kind
    {"id": "q3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}   # a raw chat request

`id` defaults to the line number; `context` (prompt and task forms) is shared context for the fixed prefix;
`json_schema` (prompt and messages forms) asks for structured output. Results go out as JSONL, in input
order, one line per item: id, status, text, parsed JSON, failure, metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tqdm import tqdm

from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import BatchProgress
from lanes_pipeline.cpu_lane.jobs.prompts import ASK, SHORT_ANSWER, PromptLayout, TaskKind, task_kind
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, over_failure_ratio
from lanes_pipeline.embedded.servers import running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.http import ChatMessage
from lanes_pipeline.settings import ConfigError, CpuLane, LanesConfig, Settings, load_settings


class BatchLine(BaseModel):
    """One line of a batch file; exactly one of `prompt`, `task` (+ `input`), `messages`."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    prompt: str | None = None
    system: str | None = Field(None, description="prompt form: instructions instead of the ask task's")
    task: str | None = None
    input: str | None = None
    context: str = ""
    messages: list[ChatMessage] | None = None
    json_schema: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _one_form(self) -> BatchLine:
        forms = [name for name in ("prompt", "task", "messages") if getattr(self, name) is not None]
        if len(forms) != 1:
            raise ValueError(f"give exactly one of prompt, task, messages (got {', '.join(forms) or 'none'})")
        if self.task is not None and self.input is None:
            raise ValueError("the task form needs an input")
        if self.task is not None and self.json_schema is not None:
            raise ValueError("a task kind brings its own schema; json_schema is for prompt and messages")
        return self

    def to_request(self, line_no: int) -> BatchRequest:
        item_id = self.id or f"line-{line_no}"
        if self.messages is not None:
            return BatchRequest(
                id=item_id,
                messages=self.messages,
                max_tokens=self.max_tokens or ASK.max_tokens,
                temperature=self.temperature,
                json_schema=self.json_schema,
            )
        if self.task is not None:
            layout = PromptLayout(task_kind(self.task), shared_context=self.context)
            request = layout.build(item_id, self.input or "", self.max_tokens)
        else:
            kind = ASK if self.system is None else TaskKind(name="custom", instructions=self.system)
            request = PromptLayout(kind, shared_context=self.context).build(
                item_id, self.prompt or "", self.max_tokens
            )
            if self.json_schema is not None:
                request = request.model_copy(update={"json_schema": self.json_schema})
        return request.model_copy(update={"temperature": self.temperature})


def read_batch_file(path: Path) -> list[BatchRequest]:
    """Every line checked before anything is sent; errors name file, line and reason."""
    requests, problems = [], []
    for line_no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            requests.append(BatchLine.model_validate_json(raw).to_request(line_no))
        except (ValidationError, KeyError) as exc:
            reason = (
                "; ".join(e["msg"] for e in exc.errors()) if isinstance(exc, ValidationError) else str(exc)
            )
            problems.append(f"{path}:{line_no}: {reason}")
    if problems:
        raise click.ClickException("invalid batch file:\n" + "\n".join(problems))
    ids = [r.id for r in requests]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise click.ClickException(f"{path}: duplicate ids: {', '.join(duplicates)}")
    return requests


class TqdmProgress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = tqdm(total=total, unit="item", disable=not enabled, file=sys.stderr, dynamic_ncols=True)

    def __call__(self, progress: BatchProgress) -> None:
        self.bar.n = progress.done
        self.bar.set_postfix(cached=progress.cache_hits, failed=progress.failed, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def lane_config(settings: Settings, **overrides: object) -> LanesConfig:
    """lanes.yaml with the command line's overrides of `cpu_lane` keys (None: not given), validated."""
    given = {key: value for key, value in overrides.items() if value is not None}
    configured = settings.lanes.cpu_lane.model_dump()
    if "base_url" in given:  # one server named on the command line: not the configured endpoints
        configured.pop("endpoints", None)
    cpu_lane = CpuLane.model_validate({**configured, **given})
    return settings.lanes.model_copy(update={"cpu_lane": cpu_lane})


def _run(
    settings: Settings, lanes: LanesConfig, requests: list[BatchRequest], show_progress: bool
) -> BatchResult:
    with running_lanes(settings, ("cpu",)) as endpoints:
        resource = CpuLaneResource.from_lanes(lanes, base_url=endpoints.url("cpu"))
        bar = TqdmProgress(len(requests), show_progress)
        try:
            return resource.run_batch(requests, progress=bar)
        finally:
            bar.close()


def result_line(item: ItemResult) -> dict[str, Any]:
    return {
        "id": item.id,
        "status": item.status,
        "from_cache": item.from_cache,
        "text": item.text,
        "parsed": item.parsed,
        "failure": item.failure.model_dump() if item.failure else None,
        "metrics": item.metrics.model_dump() if item.metrics else None,
    }


@click.group()
def cpu() -> None:
    """The CPU lane: batch work on the big model behind llama-server / ik_llama.cpp."""


@cpu.command()
@click.argument("question")
@click.option("--system", help="Instructions to use instead of the default assistant prompt.")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Answer budget in tokens.")
@click.option("--json", "as_json", is_flag=True, help='Answer as {"answer": ...}, schema-constrained.')
@click.option("--overflow", type=click.Choice(["error", "shrink"]), help="Override cpu_lane.overflow.")
def ask(
    question: str, system: str | None, max_tokens: int | None, as_json: bool, overflow: str | None
) -> None:
    """Ask the CPU lane one question (cached: asking again answers from the cache)."""
    kind = SHORT_ANSWER if as_json else ASK
    if system is not None:
        kind = kind.model_copy(update={"name": "custom", "instructions": system})
    request = PromptLayout(kind).build("ask", question, max_tokens)
    try:
        settings = load_settings()
        result = _run(settings, lane_config(settings, overflow=overflow), [request], show_progress=False)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None
    item = result.results[0]
    if item.status != "ok":
        raise click.ClickException(item.failure.reason if item.failure else "failed")
    click.echo(json.dumps(item.parsed, ensure_ascii=False) if as_json else (item.text or "").strip())
    click.echo(_metrics_line(item), err=True)


@cpu.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", default="-", show_default=True, help="Where the results go, as JSONL ('-': stdout).")
@click.option("--overflow", type=click.Choice(["error", "shrink"]), help="Override cpu_lane.overflow.")
@click.option("--max-failure-ratio", type=click.FloatRange(0, 1), help="Override cpu_lane.max_failure_ratio.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def batch(
    file: Path, out: str, overflow: str | None, max_failure_ratio: float | None, progress: bool
) -> None:
    """Run every request in FILE.jsonl; exits 1 when more items failed than the failure ratio allows."""
    requests = read_batch_file(file)
    try:
        settings = load_settings()
        lanes = lane_config(settings, overflow=overflow, max_failure_ratio=max_failure_ratio)
        result = _run(settings, lanes, requests, show_progress=progress)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None
    lines = "".join(json.dumps(result_line(item), ensure_ascii=False) + "\n" for item in result.results)
    if out == "-":
        click.echo(lines, nl=False)
    else:
        Path(out).write_text(lines, encoding="utf-8")
    s = result.summary
    click.echo(
        f"{s.ok}/{s.items} ok ({s.cache_hits} from cache, {s.answered} answered, "
        f"{s.requests_sent} requests), "
        f"{s.failed} failed; {s.wall_s:.1f} s; generation {s.generation_tokens_per_s:.1f} tok/s; "
        f"latency p50 {_seconds(s.latency_p50_s)} p95 {_seconds(s.latency_p95_s)}; prefix reuse "
        f"{'n/a' if s.prefix_cache_reuse is None else f'{s.prefix_cache_reuse:.0%}'}",
        err=True,
    )
    for item in result.failed():
        click.echo(f"failed: {item.id}: {item.failure.reason if item.failure else ''}", err=True)
    allowed = lanes.cpu_lane.max_failure_ratio
    if over_failure_ratio(s.failed, s.items, allowed):
        raise click.ClickException(f"{s.failure_ratio:.0%} of items failed (allowed {allowed:.0%})")


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _metrics_line(item: ItemResult) -> str:
    if item.from_cache:
        return "(from the cache: no request sent)"
    m = item.metrics
    if m is None:
        return ""
    speed = f", {m.generation_tokens_per_s:.1f} tok/s" if m.generation_tokens_per_s else ""
    return f"({m.completion_tokens} tokens in {m.latency_s:.2f} s{speed}; prompt {m.prompt_tokens} tokens)"
