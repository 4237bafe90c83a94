"""The cpu_servers benchmark's pure parts: its workload (>= 20 analyses, one shared prefix), its targets."""

from __future__ import annotations

from lanes_pipeline.bench.cpu_servers import (
    MIN_ANALYSES,
    analysis_requests,
    markdown,
    sample_files,
    targets,
    workload_files,
)
from lanes_pipeline.cpu_lane.batching.grammar import grammar_for
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis


def test_the_workload_is_the_sample_days_then_a_fixture_day_with_one_shared_prefix() -> None:
    files = workload_files()
    sample = sample_files()
    assert len(files) >= MIN_ANALYSES and files[: len(sample)] == sample
    assert {path for path, _ in sample} >= {"textstats.py", "slug.py"}
    assert len(set(files)) == len(files)  # no analysis asked twice
    assert all(path.startswith("fixture/") and source.strip() for path, source in files[len(sample) :])
    requests = analysis_requests(files, 256)
    assert len({r.messages[0].content for r in requests}) == 1  # the prefix every request shares
    assert "textstats.py: def " in requests[0].messages[0].content  # the repository map
    assert requests[0].chat_request("m").payload()["grammar"] == grammar_for(FileAnalysis, 256)


def test_targets_and_report() -> None:
    row = {
        "generation_tok_s": 30.0,
        "prompt_tok_s": 90.0,
        "prefix_reuse": 0.5,
        "prefix_reuse_limit": 0.6,
        "parsed": 19,
        "analyses": 20,
    }
    servers = [
        {**row, "server": "ik_llama", "analysis_parse_rate": 0.95},
        {**row, "server": "llama_cpp", "analysis_parse_rate": 1.0},
    ]
    assert targets(servers) == {
        "ik_parse_rate_at_least": 0.9,
        "ik_parse_rate_met": True,
        "ik_not_below_upstream": False,
    }
    text = markdown({"analyses": 20, "max_tokens": 256, "servers": servers, "targets": targets(servers)})
    assert "| ik_llama | 30.0 | 90.0 | 50.0% | 60.0% | 95% (19/20) |" in text
    assert "ik not below upstream: MISSED" in text
