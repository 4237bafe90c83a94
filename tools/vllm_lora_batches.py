"""Generation throughput of the embedded vLLM when the base and an adapter are asked apart or side by side
(one batch holding both), in one run (A B C A B C): the figures behind embedded/vllm_patches.py. A batch
with any adapter request runs vLLM-CPU's LoRA ops for every token in it.

    .venv/bin/python tools/vllm_lora_batches.py ADAPTER_DIR [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from vllm_reserved_cpus import answer  # tools/ is on the path: 128 tokens, greedy, ignore_eos

from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.settings import load_settings

REQUESTS = 24
CONTEXT = "\n".join(
    f"def helper_{i}(items: list[int]) -> int:\n    return sum(items) * {i}\n" for i in range(40)
)


def run(url: str, models: list[str]) -> dict[str, float]:
    # prompts of about 700 tokens, each its own (no prefix shared beyond the first lines), as the judge's are
    prompts = [
        f"Task {i}.\n{CONTEXT}\nWrite the body of parse_{i}(text: str) -> tuple." for i in range(REQUESTS)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(REQUESTS) as pool:
        tokens = sum(pool.map(answer, [url] * REQUESTS, models, prompts))
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 1), "tok_s": round(tokens / seconds, 1)}


def main(adapter: Path, rounds: int) -> None:
    settings = load_settings()
    base = settings.lanes.gpu_lane.served_model_name
    half = REQUESTS // 2
    variants = {
        "base": [base] * REQUESTS,
        "adapter": ["probe"] * REQUESTS,
        "side_by_side": [base] * half + ["probe"] * half,
    }
    server = build_server(settings, "gpu", port=0, publish=False)
    server.start()
    try:
        body = {"lora_name": "probe", "lora_path": str(adapter.resolve())}
        httpx.post(f"{server.url}/v1/load_lora_adapter", json=body, timeout=120).raise_for_status()
        answer(server.url, "probe", "Say hello.")  # warm-up
        for _ in range(rounds):
            for name, models in variants.items():
                print(
                    json.dumps({"variant": name, "requests": REQUESTS} | run(server.url, models)), flush=True
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2)
