"""How an executed task is asked: greedy, and with the loop stop when the evaluation says so; the cache key
of an answer records that stop, so an answer asked without it is never taken for one asked with it."""

from __future__ import annotations

from typing import Any

from lanes_pipeline.config.models import ExecutedEvalConfig
from lanes_pipeline.gpu_lane.code_tasks import LOOP_STOP, CodeTask, answers
from lanes_pipeline.gpu_lane.judge_tasks import _loop_rule
from lanes_pipeline.http import ChatRequest, ChatResponse


class Recording:
    """Stands in for the client: records what is sent, answers with a fixed text."""

    def __init__(self) -> None:
        self.sent: list[ChatRequest] = []

    def chat(self, request: ChatRequest) -> ChatResponse:
        self.sent.append(request)
        return ChatResponse.model_validate(
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
                ],
                "usage": {"completion_tokens": 1},
            }
        )


def test_the_loop_stop_goes_with_the_request_only_when_asked() -> None:
    client: Any = Recording()
    tasks = [CodeTask(name="t1", prompt="write f"), CodeTask(name="t2", system="s", prompt="write g")]
    said = answers(client, "m", tasks, 64, workers=2, stop_loops=True)
    assert set(said) == {"t1", "t2"} and said["t1"].text == "x"
    assert all(r.payload()["repetition_detection"] == LOOP_STOP for r in client.sent)
    assert all(r.temperature == 0.0 and r.max_tokens == 64 for r in client.sent)
    answers(client, "m", tasks[:1], 64, workers=1, stop_loops=False)
    assert "repetition_detection" not in client.sent[-1].payload()


def test_the_cache_key_records_the_loop_stop() -> None:
    assert _loop_rule(ExecutedEvalConfig(stop_loops=True)) == {"stop_loops": LOOP_STOP}
    assert _loop_rule(ExecutedEvalConfig(stop_loops=False)) == {}
    assert ExecutedEvalConfig().stop_loops is True
