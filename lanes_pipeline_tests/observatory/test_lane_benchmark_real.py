"""The lane benchmark against a real llama-server: a trial starts its own server with the trial's flags,
measures it on the small workload, and leaves nothing running."""

from __future__ import annotations

import shlex

import psutil
import pytest

from lanes_pipeline.config.trials import TrialSpec
from lanes_pipeline.observatory.trials import run_trial
from lanes_pipeline.observatory.workload import SMALL
from lanes_pipeline.settings import Settings


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_engine")
def test_a_cpu_trial_measures_the_lane_and_leaves_no_server(settings: Settings) -> None:
    # Upstream llama-server, built once by pip: this test is about the benchmark, not about building ik.
    spec = TrialSpec(
        name="test-q4_1-s2",
        lane="cpu",
        model="smollm2-135m-instruct-q4_1",
        cpu={"engine": "llama_cpp", "slots": 2},
    )
    record = run_trial(spec, settings, SMALL, other="none")
    assert record.ok, f"{record.error}\n{record.log_tail}"
    argv = shlex.split(record.command)
    assert argv[argv.index("-np") + 1] == "2" and "--metrics" in argv
    port = int(argv[argv.index("--port") + 1])
    f = record.figures
    assert f is not None and f.engine == "llama.cpp" and f.slots == 2
    assert (
        0 < f.ttft_s < 60 and f.prompt_tok_s > 0 and f.generation_tok_s > 0 and f.generation_tok_s_slots > 0
    )
    assert 0 < f.p50_s <= f.p95_s
    # The prefix phase repeats the repo map: the server's own counter shows the second request reused it.
    assert f.prefix_hit is not None and 0.2 < f.prefix_hit <= 1.0
    # PF divides by the parameters the served GGUF holds (SmolLM2-135M: 134.5 M), read from its header.
    params = record.params
    assert params is not None and params.source == "gguf" and not params.moe
    assert params.active_params_b == pytest.approx(0.1345, abs=0.001) == params.total_params_b
    assert f.pf == pytest.approx(f.generation_tok_s / params.active_params_b)
    assert record.interference is None  # no other lane asked for
    listening = [
        c for c in psutil.net_connections("inet") if c.laddr and c.laddr.port == port and c.status == "LISTEN"
    ]
    assert listening == []
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if f"--port {port}" in " ".join(p.info["cmdline"] or [])
    ]
