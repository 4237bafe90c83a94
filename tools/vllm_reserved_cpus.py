"""Generation throughput of the embedded vLLM with and without a CPU kept for its engine loop
(VLLM_CPU_NUM_OF_RESERVED_CPU), side by side in one run (A B A B): the figures behind
`embedded.servers.vllm_reserved_cpus`.

    .venv/bin/python tools/vllm_reserved_cpus.py [default|reserved0|reserved1 ...]
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.settings import load_settings

# "default": what the embedded lane sets on this machine; the others force a value.
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "reserved0": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
    "reserved1": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"},
}
REQUESTS, MAX_TOKENS = 24, 128


def answer(url: str, model: str, prompt: str) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # every answer is MAX_TOKENS long: the same work in every variant
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def main(names: list[str]) -> None:
    settings = load_settings()
    model = settings.lanes.gpu_lane.served_model_name
    prompts = [f"Write Python function {i}: parse a date string into a tuple." for i in range(REQUESTS)]
    for name in names:
        server = build_server(settings, "gpu", port=0, publish=False)
        server.command.env.update(VARIANTS[name])
        server.start()
        try:
            answer(server.url, model, "Say hello.")  # warm-up
            started = time.perf_counter()
            with ThreadPoolExecutor(REQUESTS) as pool:
                tokens = sum(pool.map(answer, [server.url] * REQUESTS, [model] * REQUESTS, prompts))
            seconds = time.perf_counter() - started
        finally:
            server.stop()
        reserved = server.command.env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "vLLM's choice")
        figures = {"variant": name, "reserved": reserved, "requests": REQUESTS, "tokens": tokens}
        print(json.dumps(figures | {"seconds": round(seconds, 1), "tok_s": round(tokens / seconds, 1)}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["reserved1", "reserved0", "reserved1", "reserved0"])
