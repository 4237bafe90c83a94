"""Both embedded CPU engines: ik_llama.cpp's llama-server (the default) and upstream llama.cpp's.

A compatibility subset runs on each engine (the client's reading of the server, a batch re-run that sends
nothing, file analyses that parse, and in the slow tier one day of the CPU-lane assets on upstream: the
whole suite runs them on ik); then what only ik does: long prompts in both slots at once (its
flash-attention kernels aborted the server on any two concurrent requests, hence `-fa off`), MoE flags
passed through, and a flag it rejects named in the start error.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.batching.client import CpuClient, ServerInfo
from lanes_pipeline.cpu_lane.jobs.prompts import ASK, PromptLayout
from lanes_pipeline.cpu_lane.jobs.tasks import ANALYSIS, FileAnalysis, file_prompt
from lanes_pipeline.embedded.servers import EmbeddedServer, build_server
from lanes_pipeline.errors import EmbeddedStartError
from lanes_pipeline.repos.sample_repo import FIRST_MODULES
from lanes_pipeline.settings import EmbeddedCpuServer, Settings
from lanes_pipeline_tests.conftest import settings_with_cpu_engine
from lanes_pipeline_tests.cpu_lane.fixtures import (
    MetricsSampler,
    batch_config,
    private_cpu_server,
    questions,
    run_batch,
    settings_with_cpu_lane,
)
from lanes_pipeline_tests.cpu_lane.test_cpu_assets import Pipeline

pytestmark = pytest.mark.timeout(1800)

SAMPLE_REPO = Path(__file__).parents[2] / "lanes_pipeline" / "cpu_lane" / "sample_repo"


def _engine(server: EmbeddedServer) -> str:
    return "ik_llama" if "ik-llama" in server.command.argv[0] else "llama_cpp"


def test_the_client_reads_each_engines_slots_context_and_server(
    cpu_server_each_engine: EmbeddedServer, settings: Settings
) -> None:
    embedded = settings.lanes.cpu_lane.embedded
    with CpuClient(cpu_server_each_engine.url) as client:
        info = client.server_info(settings.lanes.cpu_lane.model)
        code, health = client.health()
        counted = client.count_prompt_tokens(questions(1)[0].messages)
    assert (info.total_slots, info.per_slot_ctx) == (
        embedded.parallel,
        embedded.ctx_size // embedded.parallel,
    )
    assert info.model_path and info.model_path.endswith(".gguf")
    assert code == 200 and health.status == "ok" and counted > 10
    if _engine(cpu_server_each_engine) == "ik_llama":
        assert "ik_llama" in info.server and health.slots_idle is not None  # ik adds slot counts
        assert cpu_server_each_engine.command.argv[-6:] == ["-fa", "off", "-b", "32", "-ub", "32"]
    else:
        assert "ik_llama" not in info.server and "-fa" not in cpu_server_each_engine.command.argv


def test_a_rerun_sends_nothing_on_each_engine(
    cpu_server_each_engine: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    url, requests = cpu_server_each_engine.url, questions(6, offset=40)
    with CpuClient(url) as client:
        before = client.counters()
        first = run_batch(url, tmp_path / "c.sqlite3", batch_config(settings), requests)
        between = client.counters()
        second = run_batch(url, tmp_path / "c.sqlite3", batch_config(settings), requests)
        after = client.counters()
    assert first.summary.answered == 6 and first.summary.failed == 0
    # ik's empty answers (asked again, never cached) count on the server and in the summary's discarded
    summary = first.summary
    assert between.tokens_since(before)[1] == summary.completion_tokens + summary.discarded_completion_tokens
    assert summary.completion_tokens > 0
    assert after.tokens_since(between) == (0, 0)  # the server's own counters: nothing evaluated
    assert (second.summary.cache_hits, second.summary.requests_sent) == (6, 0)
    assert [r.text for r in second.results] == [r.text for r in first.results]


def _analysis_requests(count: int) -> list[Any]:
    # The sample's first modules (slug.py, textstats.py), latest version: what this test was sized for.
    chosen = {p.name: p for p in SAMPLE_REPO.glob("day*/*.py") if p.stem in FIRST_MODULES}
    files = sorted(chosen.items())[:count]
    layout = PromptLayout(ANALYSIS)
    return [layout.build(name, file_prompt(name, path.read_text())) for name, path in files]


def test_file_analyses_parse_on_each_engine(
    cpu_server_each_engine: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    """ik's answers to the analysis schema ran into max_tokens inside a string; the bounded grammar makes
    every answer complete JSON that the model accepts, on both engines."""
    requests = _analysis_requests(2)
    result = run_batch(cpu_server_each_engine.url, tmp_path / "c.sqlite3", batch_config(settings), requests)
    assert [r.status for r in result.results] == ["ok"] * len(requests), [r.failure for r in result.results]
    for item in result.results:
        FileAnalysis.model_validate(item.parsed)
        assert item.metrics is not None and not item.metrics.truncated and not item.repaired


# The assets' day on upstream: the fast tier runs it on ik (test_cpu_assets.py) and keeps upstream's batch
# path above (the client's reading of the server, a re-run that sends nothing, analyses that parse).
@pytest.mark.slow
def test_one_day_of_cpu_lane_assets_on_upstream(
    cpu_server_upstream: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    pipeline = Pipeline(tmp_path, settings, cpu_server_upstream)
    day1 = pipeline.run("2026-11-01")
    again = pipeline.run("2026-11-01")
    analysis = day1.metadata["repo_analysis"]
    assert (
        analysis["items"] == 1 and analysis["asked_this_run"] == 1
    )  # a first day: one symbol of the backlog
    assert day1.checks["repo_analysis_parse_rate"] is True
    assert again.requests() == 0 and again.server_tokens == day1.server_tokens
    assert again.hash("lora_dataset") == day1.hash("lora_dataset")


def near_full_request(client: CpuClient, info: ServerInfo, item: int, max_tokens: int = 8) -> BatchRequest:
    """A question after a long list, sized with the server's own token counts to leave the slot's context
    just room for the answer (a shrunk prompt ends in a cut list, which this small model answers with
    nothing at all)."""
    layout = PromptLayout(ASK)

    def build(count: int) -> BatchRequest:
        words = " ".join(f"w{item}x{i}" for i in range(count))
        return layout.build(f"long{item}", f"{words}\nWhich word of this list comes last?", max_tokens)

    low, high = 1, 4000
    while high - low > 1:  # the most words that still fit
        middle = (low + high) // 2
        fits = client.count_prompt_tokens(build(middle).messages) + max_tokens <= info.per_slot_ctx
        low, high = (middle, high) if fits else (low, middle)
    return build(low)


@pytest.mark.slow  # a regression of ik_llama.cpp's own kernels
def test_long_prompts_in_both_ik_slots_at_once_do_not_crash_it(
    cpu_server_ik: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    """Two prompts that fill their slots' context, sent together: ik's flash-attention kernels aborted the
    server on any two concurrent requests (hence `-fa off`), and such a pair then failed with HTTP 500 "KV
    cache is full" on every retry (hence `-b` equal to `-ub`)."""
    with CpuClient(cpu_server_ik.url) as client:
        info = client.server_info(settings.lanes.cpu_lane.model)
        requests = [near_full_request(client, info, item) for item in range(2)]
    result = run_batch(cpu_server_ik.url, tmp_path / "c.sqlite3", batch_config(settings), requests)
    assert cpu_server_ik.process is not None and cpu_server_ik.process.poll() is None  # still running
    # Every prompt was evaluated: answered, or (this 135M model, greedy, after a list of 2000 tokens) its
    # answer was the end token, asked again as often as the policy allows. Never a 500 or a lost server.
    failures = [r.failure for r in result.results if r.failure is not None]
    assert result.summary.answered >= 1 and all(f.kind == "empty" for f in failures), failures
    for answered in result.results:
        assert answered.metrics is None or answered.metrics.prompt_tokens > info.per_slot_ctx - 64
    after = run_batch(
        cpu_server_ik.url, tmp_path / "d.sqlite3", batch_config(settings), questions(2, offset=60)
    )
    assert after.summary.answered == 2


def fail_slot_actions(url: str) -> list[str]:
    """A restore of a file that does not exist into each slot, and an erase of a slot that does not exist:
    each answer's status and ik's message (ik 0.1.5 answered none of them: the client gives up after 5 s)."""
    answers = []
    with httpx.Client(base_url=url, timeout=5.0) as http:
        for slot, action, body in (
            (0, "restore", {"filename": "absent.bin"}),
            (1, "restore", {"filename": "absent.bin"}),
            (7, "erase", {}),
        ):
            response = http.post(f"/slots/{slot}", params={"action": action}, json=body)
            answers.append(f"{response.status_code} {response.json()['error']['message']}")
    return answers


def peak_processing(url: str) -> float:
    """llama-server's own peak of requests processing while two clients each ask three questions (answers
    of 48 tokens), a /metrics poller running beside them. Plain requests, not a batch: the batch's slot
    copy makes slot actions of its own."""

    def ask(client_index: int) -> int:
        with httpx.Client(base_url=url, timeout=120.0) as http:
            for turn in range(3):
                content = f"Client {client_index}, question {turn}: count from 1 to 40."
                body = {"messages": [{"role": "user", "content": content}], "max_tokens": 48}
                http.post("/v1/chat/completions", json=body | {"ignore_eos": True}).raise_for_status()
        return 3

    with MetricsSampler(url, interval_s=0.02) as sampler, ThreadPoolExecutor(2) as pool:
        answered = sum(pool.map(ask, range(2)))
    assert answered == 6 and sampler.samples > 0
    return sampler.max_processing


@pytest.mark.usefixtures("cpu_engine")
def test_a_failed_slot_action_is_answered_and_takes_no_handler_from_ik(settings: Settings) -> None:
    """ik 0.1.5 sent a failed slot action's error where its handler does not wait: never answered, the HTTP
    thread lost, and on 2 cores its own 4 handlers then ran one completion at a time beside a poller. The
    embedded build answers it (embedded/ik_patches.py); checked with ik's own 4 handlers, not the spares the
    embedded server keeps."""
    ik = settings_with_cpu_engine(settings, "ik_llama")
    own_handlers = settings_with_cpu_lane(ik, embedded=EmbeddedCpuServer(extra_args=["--threads-http", "4"]))
    with private_cpu_server(own_handlers) as server:
        no_room = "Unable to restore slot, no available space in KV cache or invalid slot save file"
        assert fail_slot_actions(server.url) == [f"400 {no_room}", f"400 {no_room}", "400 Invalid slot ID"]
        assert peak_processing(server.url) == 2


@pytest.mark.usefixtures("cpu_engine")
def test_moe_flags_pass_through_to_ik_and_a_rejected_flag_is_named(
    settings: Settings, tmp_path: Path
) -> None:
    """The README's MoE example starts (on a dense model the flags change nothing); a flag ik does not know
    stops it at start with its own message, which leads the error's tail (ik prints its usage after it)."""
    ik = settings_with_cpu_engine(settings, "ik_llama")
    moe = ["-rtr", "-ot", "exps=CPU", "-amb", "512", "-mla", "3"]
    lane = settings_with_cpu_lane(ik, embedded=EmbeddedCpuServer(extra_args=moe))
    with private_cpu_server(lane) as server:
        assert server.command.argv[-len(moe) - 6 :] == ["-fa", "off", "-b", "32", "-ub", "32", *moe]
        assert run_batch(
            server.url, tmp_path / "c.sqlite3", batch_config(settings), questions(1, offset=70)
        ).summary.answered
    chosen = build_server(
        settings_with_cpu_lane(ik, embedded=EmbeddedCpuServer(extra_args=["-fa", "on"])), "cpu", 0, False
    )
    assert chosen.command.argv.count("-fa") == 1  # the user's choice, not ours
    rejected = settings_with_cpu_lane(ik, embedded=EmbeddedCpuServer(extra_args=["--no-such-flag"]))
    with pytest.raises(EmbeddedStartError) as caught, private_cpu_server(rejected):
        pass
    message = str(caught.value)
    assert "exited with code" in message and "error: unknown argument: --no-such-flag" in message
