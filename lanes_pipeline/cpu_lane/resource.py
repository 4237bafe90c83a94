"""The CPU lane as a Dagster resource: the big MoE model behind ik_llama.cpp / llama-server.

Every CPU-lane asset goes through `run_batch`: slot-bounded, cached (a re-run of a day asks the model
nothing), resumable (each answer is committed as it arrives), with progress lines and summary metadata.

Concurrency across runs: CPU-lane assets declare `pool="cpu_lane"`, whose limit `lanes run` / `lanes dev`
set to the server's slots (lanes_pipeline/instance.py); every batch, in any process (a Dagster step, the
`lanes cpu` CLI), takes the same slots through per-slot lock files under `<data>/run/cpu-lane-slots/`, so
two runs share the server's slots instead of doubling the queue.

Bandwidth: while the GPU lane is busy (vLLM's running requests above `gpu_busy_above`), a batch keeps at
most `min_in_flight` requests in flight (lanes/bandwidth.py); `yield_to_gpu: false` turns this off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from dagster import Failure, MetadataValue

from lanes_pipeline.cpu_lane.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.bandwidth import YieldEvent, YieldPolicy, yielding_to_gpu
from lanes_pipeline.cpu_lane.batch import BatchResult, BatchRunner
from lanes_pipeline.cpu_lane.batch_models import BatchConfig, BatchRequest
from lanes_pipeline.cpu_lane.batch_summary import BatchProgress, ProgressCallback
from lanes_pipeline.cpu_lane.client import CpuClient
from lanes_pipeline.embedded.lane_resource import LaneResource
from lanes_pipeline.embedded.servers import LaneName, running_embedded_url
from lanes_pipeline.settings import EMBEDDED, BandwidthConfig, CpuLane, GpuLane, data_dir


class InfoLog(Protocol):
    """What progress lines need: `context.log` in a run, a `logging.Logger` elsewhere."""

    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...


class LogProgress:
    """Progress as log lines: counts and ETA at most every `every_s` seconds, and always at the end."""

    def __init__(self, log: InfoLog, label: str, every_s: float = 30.0) -> None:
        self.log, self.label, self.every_s = log, label, every_s
        self._last = float("-inf")

    def __call__(self, progress: BatchProgress) -> None:
        now = time.monotonic()
        if progress.done < progress.total and now - self._last < self.every_s:
            return
        self._last = now
        self.log.info(f"CPU lane {self.label}: {progress.line()}")


def default_cache_path() -> Path:
    return data_dir() / "cache" / "cpu_lane.sqlite3"


class CpuLaneResource(LaneResource):
    """Batch work for the CPU lane; `embedded` finds or starts the bundled llama-server."""

    lane: ClassVar[LaneName] = "cpu"

    model_alias: str = "smollm2"
    max_slots: int = 2
    model: str = "smollm2-135m-instruct-q4_1"  # the configured name: part of the weights fingerprint
    cache_path: str | None = None
    overflow: Literal["error", "shrink"] = "error"
    ready_timeout_s: float = 600.0
    max_failure_ratio: float = 0.1
    # Yielding to the GPU lane (configs/lanes.yaml `bandwidth`). `gpu_url: embedded` watches the embedded
    # GPU lane when one is running, and never starts one for this.
    yield_to_gpu: bool = True
    gpu_url: str = EMBEDDED
    gpu_api_key_env: str | None = None
    gpu_busy_above: int = 0
    min_in_flight: int = 1
    bandwidth_quiet_s: float = 5.0
    bandwidth_poll_s: float = 1.0

    @classmethod
    def from_config(
        cls,
        config: CpuLane,
        base_url: str | None = None,
        bandwidth: BandwidthConfig | None = None,
        gpu: GpuLane | None = None,
    ) -> CpuLaneResource:
        """`base_url` overrides the configured one: the URL of a server `running_lanes` already resolved.
        `bandwidth` and `gpu` (the GPU lane it yields to) come from the same lanes.yaml."""
        fields = {**cls.connection_fields(config), **({"base_url": base_url} if base_url else {})}
        if bandwidth is not None:
            fields |= {
                "yield_to_gpu": bandwidth.yield_to_gpu,
                "gpu_busy_above": bandwidth.gpu_busy_above,
                "min_in_flight": bandwidth.cpu_min_in_flight,
                "bandwidth_quiet_s": bandwidth.quiet_s,
                "bandwidth_poll_s": bandwidth.poll_s,
            }
        if gpu is not None:
            fields |= {"gpu_url": gpu.base_url, "gpu_api_key_env": gpu.api_key_env}
        return cls(
            **fields,
            model_alias=config.model_alias,
            max_slots=config.max_slots,
            model=config.model,
            cache_path=config.cache_path,
            overflow=config.overflow,
            ready_timeout_s=config.ready_timeout_s,
            max_failure_ratio=config.max_failure_ratio,
        )

    def cpu_client(self) -> CpuClient:
        return CpuClient(
            self.url,
            self.api_key(),
            timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            retry=self.retry_policy(),
        )

    def resolved_cache_path(self) -> Path:
        return Path(self.cache_path) if self.cache_path else default_cache_path()

    def batch_config(self) -> BatchConfig:
        return BatchConfig(
            model_alias=self.model_alias,
            configured_model=self.model,
            max_slots=self.max_slots,
            overflow=self.overflow,
            ready_timeout_s=self.ready_timeout_s,
            lease_dir=data_dir() / "run" / "cpu-lane-slots",
        )

    def yield_policy(self) -> YieldPolicy:
        return YieldPolicy(
            gpu_busy_above=self.gpu_busy_above,
            cpu_min_in_flight=self.min_in_flight,
            quiet_s=self.bandwidth_quiet_s,
            poll_s=self.bandwidth_poll_s,
        )

    def gpu_metrics_url(self) -> str | None:
        """The GPU lane to yield to, without starting one: None when off or when no embedded one runs."""
        if not self.yield_to_gpu:
            return None
        if self.gpu_url != EMBEDDED:
            return self.gpu_url
        return running_embedded_url(data_dir(), "gpu")

    def run_batch(
        self,
        requests: Sequence[BatchRequest],
        log: InfoLog | None = None,
        label: str = "batch",
        progress: ProgressCallback | None = None,
        log_every_s: float = 30.0,
    ) -> BatchResult:
        """Run `requests`; results come back in input order. `log` (e.g. `context.log`) gets progress lines
        with counts and ETA; `progress` (any callable taking a BatchProgress, e.g. a tqdm updater) too."""
        callbacks = [cb for cb in (LogProgress(log, label, log_every_s) if log else None, progress) if cb]

        def report(state: BatchProgress) -> None:
            for callback in callbacks:
                callback(state)

        def on_yield(event: YieldEvent) -> None:
            if log is not None:
                state = (
                    f"yields to the GPU lane ({event.gpu_running:g} running on vLLM): at most {event.cap} "
                    "in flight"
                    if event.cap is not None
                    else "has its slots back (GPU lane quiet)"
                )
                log.info(f"CPU lane {label}: {state}")

        gpu_api_key = os.environ.get(self.gpu_api_key_env) if self.gpu_api_key_env else None
        with (
            self.cpu_client() as client,
            ResponseCache(self.resolved_cache_path()) as cache,
            yielding_to_gpu(self.gpu_metrics_url(), self.yield_policy(), gpu_api_key, on_yield) as governor,
        ):
            cap = governor.cap if governor is not None else None
            result = BatchRunner(client, cache, self.batch_config(), cap=cap).run(requests, report)
            if governor is not None:
                result.bandwidth = governor.report()
        if log is not None:
            s = result.summary
            log.info(
                f"CPU lane {label}: {s.ok}/{s.items} ok ({s.cache_hits} from cache, {s.answered} answered), "
                f"{s.failed} failed; {s.generation_tokens_per_s:.1f} gen tok/s, prefix reuse "
                f"{_percent(s.prefix_cache_reuse)}"
            )
        return result

    def check_failures(self, result: BatchResult, max_ratio: float | None = None) -> None:
        """Fail the asset when more items failed than the configured ratio allows (the caller decides)."""
        allowed = self.max_failure_ratio if max_ratio is None else max_ratio
        if result.summary.failure_ratio <= allowed:
            return
        raise Failure(
            description=(
                f"{result.summary.failed} of {result.summary.items} CPU-lane items failed "
                f"({result.summary.failure_ratio:.0%} > allowed {allowed:.0%}); answers so far are cached, "
                f"so a re-run asks only for the missing ones"
            ),
            metadata=batch_metadata(result),
        )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def batch_metadata(result: BatchResult) -> dict[str, Any]:
    """Dagster metadata for a batch: plotted numbers, plus a table of failures when there are any."""
    metadata: dict[str, Any] = {f"cpu_lane/{k}": v for k, v in result.summary.metadata().items()}
    metadata["cpu_lane/server"] = f"{result.server.server} at {result.server.url}"
    metadata["cpu_lane/slots"] = result.server.total_slots
    metadata["cpu_lane/per_slot_ctx"] = result.server.per_slot_ctx
    if result.bandwidth is not None:
        metadata |= {f"cpu_lane/{k}": v for k, v in result.bandwidth.metadata().items()}
    failed = result.failed()
    if failed:
        rows = ["| item | kind | reason |", "|---|---|---|"]
        for item in failed[:50]:
            reason = (
                (item.failure.reason if item.failure else "").replace("|", "\\|").replace("\n", " ")[:300]
            )
            rows.append(f"| {item.id} | {item.failure.kind if item.failure else ''} | {reason} |")
        if len(failed) > 50:
            rows.append(f"| ... | | {len(failed) - 50} more |")
        metadata["cpu_lane/failures"] = MetadataValue.md("\n".join(rows))
    return metadata
