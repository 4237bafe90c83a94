"""`make run` is the whole daily pipeline: `lanes run --date D` against the real lanes materializes every
asset of `daily_lanes` for D (CPU-lane batch work over the sample repository, the dataset, a LoRA trained,
judged and hot-loaded into vLLM), prints the summary table, and a second run of the same day asks the CPU
lane nothing and says so, which llama-server's own counters confirm."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from lanes_pipeline.cli import main
from lanes_pipeline.cli.run_summary import (
    RESULTS,
    AssetOutcome,
    LaneDeltas,
    ServedState,
    render,
    summarize_day,
)
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedDocsFigures, GeneratedTestsFigures, ReviewFigures
from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline_tests.daily.fixtures import daily_project

DAY = "2026-11-02"  # the sample repository's second commit: three files changed that day
ALIAS = "lanes-current"


def _row(output: str, asset: str) -> list[str]:
    [line] = [line for line in output.splitlines() if line.split()[:1] == [asset]]
    return re.split(r"\s{2,}", line.strip())


@pytest.mark.slow  # the README's command as a user runs it; its promises have fast tests of their own
@pytest.mark.timeout(2400)  # a whole day, twice, on 2 shared cores
def test_make_run_is_the_whole_day_and_a_rerun_asks_nothing(
    cpu_server: EmbeddedServer,
    gpu_server: EmbeddedServer,
    settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = daily_project(tmp_path_factory.mktemp("daily-run"), settings, cpu_server.url, gpu_server.url)
    for name, value in project.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("lanes_pipeline.definitions.defs", lambda: build_definitions(load_settings()))

    first = CliRunner().invoke(main, ["run", "--date", DAY])
    assert first.exit_code == 0, first.output
    assets = [
        "cpu_lane_probe",
        "gpu_lane_probe",
        "repo_snapshot",
        "day_symbols",
        "repo_analysis",
        "generated_tests",
        "refactor_proposals",
        "verified_bodies",
        "accepted_work",
        "review_branch",
        "held_out_tasks",
        "lora_dataset",
        "lora_adapter",
        "adapter_evaluation",
        "served_adapter",
    ]
    for asset in assets:
        assert _row(first.output, asset)[1] == "materialized", first.output
    # The day's files asked from an empty cache, at least two (a repair counts as a call too).
    assert int(_row(first.output, "repo_analysis")[2]) >= 2, first.output
    assert f"lanes-{DAY}" in _row(first.output, "lora_adapter")[-1], first.output
    assert _row(first.output, "adapter_evaluation")[-1] == "promote", first.output
    assert f"promoted yes, served yes ({ALIAS} -> lanes-{DAY})" in first.output, first.output
    # The summary closes with the day's review branch and the command that shows it. Whether the 135M model
    # writes an accepted test on this day differs between machines (its sampled answers do), so the check
    # is that the summary and review_branch agree; the branch itself is covered in test_review_branch*.
    closing = first.output[: first.output.index("  wall time")].rstrip().splitlines()[-1]
    review = _row(first.output, "review_branch")[-1]
    accepted = re.search(r"tests accepted (\d+), diffs accepted (\d+)", first.output)
    assert accepted is not None, first.output
    if review.startswith("no review branch"):
        assert accepted.groups() == ("0", "0") and "The day's work" not in closing, first.output
    else:
        assert closing.startswith(f"  The day's work is on the branch lanes/{DAY}; read it with: git -C ")
        assert re.search(r"tests pass at (\d+) of \1 tips", review), first.output
    with VllmClient(gpu_server.url) as client:  # really served: the alias answers from the day's folder
        cards = {card.id: card for card in client.adapters()}
    assert cards[ALIAS].root is not None and cards[ALIAS].root.endswith(f"lanes-{DAY}")

    with CpuClient(cpu_server.url) as client:
        before = client.counters()
    second = CliRunner().invoke(main, ["run", "--date", DAY])
    with CpuClient(cpu_server.url) as client:
        after = client.counters()
    assert second.exit_code == 0, second.output
    assert (
        "LLM calls for the day's work: 0 (llama-server computed 0 prompt and 0 generated tokens, "
        "vLLM finished 0 requests)" in second.output
    )
    assert "(reused)" in _row(second.output, "lora_adapter")[-1]
    for asset in ("repo_analysis", "generated_tests", "refactor_proposals"):
        assert _row(second.output, asset)[2] == "0", second.output
    # The whole second `lanes run` cost the CPU lane two probes (CLI and asset), nothing more.
    prompt, generated = after.tokens_since(before)
    assert generated <= 2 * 64 and prompt <= 2 * 64

    with DagsterInstance.get() as instance:
        runs = instance.get_runs(RunsFilter(job_name="daily_lanes", tags={"dagster/partition": DAY}))
    assert len(runs) == 2 and all(run.status == DagsterRunStatus.SUCCESS for run in runs)
    print(first.output[first.output.index("daily_lanes for") :])
    print(second.output[second.output.index("daily_lanes for") :])


def test_summary_says_zero_only_when_both_sides_agree() -> None:
    rows = [
        AssetOutcome(
            asset="repo_analysis",
            partition=DAY,
            status="materialized",
            metadata={"llm_requests": 0, "cache_hits": 3, "llm_answered": 0, "files": 3, "analysed_ok": 3},
        )
    ]
    served = ServedState(alias=ALIAS, target=None, loaded=[])
    quiet = summarize_day(DAY, rows, LaneDeltas(cpu_prompt_tokens=0, cpu_generated_tokens=0), served)
    assert quiet.asked_nothing
    assert "LLM calls for the day's work: 0 " in render(quiet)
    # Someone else used the server meanwhile: the client sent nothing, but the server counted tokens.
    busy = summarize_day(DAY, rows, LaneDeltas(cpu_prompt_tokens=40, cpu_generated_tokens=9), served)
    assert not busy.asked_nothing
    assert "LLM calls for the day's work: 0 to the CPU lane (llama-server computed 40 prompt" in render(busy)
    unknown = summarize_day(DAY, rows, LaneDeltas(), served)  # a server without --metrics proves nothing
    assert not unknown.asked_nothing
    # The GPU lane counts too: a day that evaluated or promoted an adapter asked vLLM.
    quiet_gpu = summarize_day(
        DAY, rows, LaneDeltas(cpu_prompt_tokens=0, cpu_generated_tokens=0, gpu_requests=0), served
    )
    assert quiet_gpu.asked_nothing
    assert "0 generated tokens, vLLM finished 0 requests): a re-run" in render(quiet_gpu)
    evaluated = summarize_day(
        DAY, rows, LaneDeltas(cpu_prompt_tokens=0, cpu_generated_tokens=0, gpu_requests=9), served
    )
    assert not evaluated.asked_nothing
    assert "(executed evaluation tasks, promotion smoke tests): 9" in render(evaluated)
    assert "served no (lanes-current is not loaded)" in render(quiet)


def test_summary_prints_the_days_learning_line_when_the_day_was_evaluated() -> None:
    line = "learning 2026-11-02: served lanes-2026-11-02 repo_pass_rate 15% (base 10%)"
    rows = [
        AssetOutcome(
            asset="adapter_evaluation",
            partition=DAY,
            status="materialized",
            metadata={"promote": True, "learning": line},
        ),
    ]
    summary = summarize_day(DAY, rows, LaneDeltas(), None)
    assert f"  {line}  (the curve over the days: lanes report)" in render(summary).splitlines()
    assert "learning" not in render(summarize_day(DAY, [], LaneDeltas(), None))


def test_summary_shows_the_test_coverage_of_the_days_repositories() -> None:
    figures = GeneratedTestsFigures(
        candidates=6, accepted=2, symbols=40, symbols_with_accepted_test=9, test_coverage=0.225
    )
    described = RESULTS["generated_tests"](figures.metadata())
    assert described == "2 of 6 tests accepted; coverage 9 of 40 symbols (22%)"
    docs = GeneratedDocsFigures(
        candidates=6, accepted=1, symbols=40, symbols_with_accepted_docs=3, docs_coverage=0.075
    )
    expected = "1 of 6 docstrings accepted; coverage 3 of 40 symbols (8%)"
    assert RESULTS["generated_docs"](docs.metadata()) == expected


def test_summary_says_once_why_a_module_was_not_asked() -> None:
    """An empty day names its cause (issue 55): the modules that do not import, and the first one's reason."""
    why = "mine: `import pkg` fails in the sandbox: ModuleNotFoundError: No module named 'pkg._version'"
    figures = GeneratedTestsFigures(candidates=0, symbols=20, modules_not_importable=3, import_problem=why)
    assert RESULTS["generated_tests"](figures.metadata()) == (
        "0 of 0 tests accepted; coverage 0 of 20 symbols (0%); "
        f"3 module(s) not asked, they do not import: {why}"
    )


def test_summary_closes_with_the_review_branch_and_the_command_to_read_it() -> None:
    command = "git -C /home/u/repo log -p 0123456789ab..lanes/2026-11-02"
    figures = ReviewFigures(repos=1, branches=1, commits=4, items_skipped=1, tips_passing=1)
    rows = [
        AssetOutcome(
            asset="review_branch",
            partition=DAY,
            status="materialized",
            metadata={**figures.metadata(), "review_commands": [command]},
        ),
        AssetOutcome(asset="lora_dataset", partition=DAY, status="materialized", metadata={"row_count": 3}),
    ]
    text = render(summarize_day(DAY, rows, LaneDeltas(), None))
    assert (
        text.splitlines()[-1]
        == f"  The day's work is on the branch lanes/2026-11-02; read it with: {command}"
    )
    described = RESULTS["review_branch"](figures.metadata())
    assert described == "4 commits on 1 review branch(es), 1 items left off; tests pass at 1 of 1 tips"
    assert RESULTS["review_branch"](ReviewFigures().metadata()).startswith("no review branch")


def test_summary_names_the_symbols_the_day_went_on_without() -> None:
    reasons = {f"lib: m.py::C.f{i}": "IndentationError: unexpected indent" for i in range(7)}
    rows = [
        AssetOutcome(
            asset="repo_analysis", partition=DAY, status="materialized", metadata={"skipped": reasons}
        ),
        AssetOutcome(asset="lora_dataset", partition=DAY, status="materialized", metadata={"skipped": {}}),
    ]
    text = render(summarize_day(DAY, rows, LaneDeltas(), None))
    assert "  7 symbol(s) skipped, the day went on without them:" in text.splitlines()
    assert "    lib: m.py::C.f0: IndentationError: unexpected indent" in text.splitlines()
    assert "    ... and 2 more (repo_analysis's `skipped`)" in text.splitlines()
    assert "skipped, the day" not in render(summarize_day(DAY, rows[1:], LaneDeltas(), None))
