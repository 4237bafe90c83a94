"""The editor's figure: a line is scored by exact match and edit similarity (stripped, in [0, 1]); each
point is asked as a greedy one-line continuation of its file; a source that is not the point's file is
refused. The last test asks the real vLLM server the sample repository's points."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from lanes_pipeline.dataset.completion_points import CompletionPoint, day_points
from lanes_pipeline.dataset.holdout_rules import held_out_symbols
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.errors import BadRequestError
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.completion import completion_answers, first_line, score_line
from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, EXACT_MATCH
from lanes_pipeline.http import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    OpenAIClient,
    Usage,
)
from lanes_pipeline.repos.sample_repo import HERE as SAMPLE_DIR
from lanes_pipeline.repos.scan import scan_repo
from lanes_pipeline.repos.symbols import all_symbols
from lanes_pipeline.settings import Settings

SOURCE = "def f(x):\n    y = x + 1\n    return y\n"
POINT = CompletionPoint(
    id="r:complete:m.py::f:3", repo="r", path="m.py", symbol="m.py::f", line=3, expected="    return y"
)


def test_an_exact_line_scores_one_whatever_its_surrounding_whitespace() -> None:
    assert score_line("    return y", "return y  ") == {EXACT_MATCH: 1.0, EDIT_SIMILARITY: 1.0}


def test_a_near_line_scores_partial_similarity_and_no_exact_match() -> None:
    scores = score_line("    return total / count", "return total / len(items)")
    assert scores[EXACT_MATCH] == 0.0 and 0.5 < scores[EDIT_SIMILARITY] < 1.0


def test_an_empty_answer_scores_zero() -> None:
    assert score_line("    return y", "") == {EXACT_MATCH: 0.0, EDIT_SIMILARITY: 0.0}
    assert score_line("    return y", "   \n") == {EXACT_MATCH: 0.0, EDIT_SIMILARITY: 0.0}


def test_the_scored_line_is_the_first_that_is_code_as_repobench_takes_it() -> None:
    assert first_line("    return y\n\ndef g():\n") == "    return y"
    assert first_line("") == "" and first_line("no newline") == "no newline"
    # a small model's newline first, or a commented-out line, is not what is scored
    assert first_line("\n    # return 0\n    return y\n") == "    return y"
    assert first_line("\n\n# only comments\n") == ""


class FakeCompletions:
    """A server that answers each prompt with a canned continuation, recording what it was sent."""

    def __init__(self, text: str, finish_reason: str = "stop") -> None:
        self.text, self.finish_reason = text, finish_reason
        self.sent: list[CompletionRequest] = []
        self.lock = threading.Lock()

    def completion(self, request: CompletionRequest) -> CompletionResponse:
        with self.lock:
            self.sent.append(request)
        choice = CompletionChoice(text=self.text, finish_reason=self.finish_reason)
        return CompletionResponse(choices=[choice], usage=Usage(completion_tokens=4))


def test_each_point_is_asked_greedily_after_its_prefix_and_scored_on_one_line() -> None:
    server: Any = FakeCompletions("\n    return y\nextra")
    answers = completion_answers(server, "base", [POINT], {"r": {"m.py": SOURCE}}, 1000, 48, workers=4)
    (request,) = server.sent
    assert request.prompt == "# m.py\ndef f(x):\n    y = x + 1"  # the newline is the model's to write
    assert (request.model, request.temperature, request.stop, request.max_tokens) == ("base", 0.0, None, 48)
    (answer,) = answers
    assert answer.task == POINT.id and answer.answer == "\n    return y\nextra" and answer.tokens == 4
    assert answer.scores == {EXACT_MATCH: 1.0, EDIT_SIMILARITY: 1.0} and answer.reason == "exact"
    cut: Any = FakeCompletions("    return x", "length")
    (miss,) = completion_answers(cut, "b", [POINT], {"r": {"m.py": SOURCE}}, 100, 4, workers=1)
    assert miss.scores[EXACT_MATCH] == 0.0 and miss.finish_reason == "length"
    assert miss.reason.startswith("similarity 0.") and "expected `return y`, got `return x`" in miss.reason


def test_a_source_that_is_not_the_points_file_is_refused() -> None:
    server: Any = FakeCompletions("x")
    with pytest.raises(ValueError, match=r"r:complete:m\.py::f:3: line 3 of r: m\.py is not '    return y'"):
        completion_answers(server, "b", [POINT], {"r": {"m.py": SOURCE.replace("y\n", "z\n")}}, 100, 4, 1)
    with pytest.raises(KeyError, match=r"no source of r: m\.py"):
        completion_answers(server, "b", [POINT], {}, 100, 4, 1)
    assert server.sent == [] and completion_answers(server, "b", [], {}, 100, 4, 1) == []


def test_the_client_posts_to_the_completions_endpoint_with_the_chats_retries_and_errors() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        if len(seen) == 1:
            return httpx.Response(503)  # retried, as a chat would be
        if json.loads(request.content)["prompt"] == "bad":
            return httpx.Response(400, json={"error": {"message": "no"}})
        choice = {"index": 0, "text": "    return y", "finish_reason": "stop"}
        # A field the wire model does not name (servers add them) is no error.
        return httpx.Response(200, json={"choices": [choice], "usage": {"completion_tokens": 3}, "extra": 1})

    client = OpenAIClient("GPU", "http://vllm.test", sleep=lambda _: None)
    client.http.close()
    client.http = httpx.Client(base_url="http://vllm.test", transport=httpx.MockTransport(answer))
    with client:
        response = client.completion(
            CompletionRequest(model="m", prompt="# m.py\n", max_tokens=8, stop=["\n"])
        )
        with pytest.raises(BadRequestError, match=r"POST /v1/completions answered HTTP 400"):
            client.completion(CompletionRequest(model="m", prompt="bad"))
    assert response.text == "    return y" and response.usage.completion_tokens == 3
    assert response.choices[0].finish_reason == "stop" and client.stats.retries == 1
    assert [path for path, _ in seen] == ["/v1/completions"] * 3
    assert seen[1][1] == {
        "model": "m",
        "prompt": "# m.py\n",
        "max_tokens": 8,
        "temperature": 0.0,
        "seed": 0,
        "stop": ["\n"],
    }


def sample_day3_points() -> tuple[list[CompletionPoint], dict[str, str]]:
    """The shipped sample's day 3 held out at 50%, read from its folder (no git needed)."""
    folder = SAMPLE_DIR / "day3"
    sources = {p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8") for p in folder.glob("*.py")}
    held = held_out_symbols("sample", all_symbols(scan_repo(sources)), 50)
    return day_points("sample", held, sources)


def test_the_base_model_continues_sample_points_through_vllm(
    gpu_server: EmbeddedServer, settings: Settings
) -> None:
    points, sources = sample_day3_points()
    chosen = points[:: max(1, len(points) // 8)][:8]
    base = settings.lanes.gpu_lane.served_model_name
    with VllmClient(gpu_server.url, timeout_s=300) as client:
        started = time.perf_counter()
        answers = completion_answers(client, base, chosen, {"sample": sources}, 2000, 48, workers=8)
        took = time.perf_counter() - started
    print(
        f"\n{len(chosen)} completion points from the base model in {took:.2f} s ({len(chosen) / took:.2f}/s)"
    )
    assert [a.task for a in answers] == [p.id for p in chosen] and len(chosen) == 8
    # greedy continuations of code: most give a code line to score (the base writes no blank line forever)
    assert sum(bool(first_line(a.answer)) for a in answers) >= len(answers) // 2, answers
    for answer in answers:
        assert answer.tokens > 0, answer
        assert set(answer.scores) == {EXACT_MATCH, EDIT_SIMILARITY}, answer
        assert all(0.0 <= v <= 1.0 for v in answer.scores.values()) and answer.reason, answer
