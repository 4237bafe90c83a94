"""The CPU lane as a Dagster resource: the big MoE model behind ik_llama.cpp / llama-server.

Every CPU-lane asset goes through `run_batch`: slot-bounded, cached (a re-run of a day asks the model
nothing), resumable (each answer is committed as it arrives), with progress lines and summary metadata.

Concurrency across runs: CPU-lane assets declare `pool="cpu_lane"`, whose limit `lanes run` / `lanes dev`
set to the server's slots (deploy/instance.py); every batch, in any process (a Dagster step, the
`lanes cpu` CLI), takes the same slots through per-slot lock files under `<data>/run/cpu-lane-slots/`, so
two runs share the server's slots instead of doubling the queue.

Several servers: `cpu_lane.endpoints` lists them, each with its slots; a batch spreads over them by free
slots and fails over when one goes down (batch.py). The `cpu_lane` pool's limit is the sum of their slots.

Bandwidth: while the GPU lane is busy (vLLM's running requests above `gpu_busy_above`), a batch keeps at
most `cpu_min_in_flight` requests in flight (bandwidth.py); `yield_to_gpu: false` turns this off.

Failures: one gate, `cpu_lane.max_failure_ratio`, read from the resource's config by the CPU-lane assets
(requests that failed for transient reasons) and by `lanes cpu batch` (failed items), through
`over_failure_ratio`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Protocol

from dagster import Failure, MetadataValue

from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchResult, BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchConfig, BatchRequest, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import BatchProgress, ProgressCallback
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.batching.endpoint_pool import CpuEndpointClient
from lanes_pipeline.embedded.lane_resource import LaneEndpoint
from lanes_pipeline.embedded.servers import LaneName, running_embedded_url
from lanes_pipeline.metrics.bandwidth import YieldEvent, yielding_to_gpu
from lanes_pipeline.settings import BandwidthConfig, CpuLane, GpuLane, LanesConfig, data_dir


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


class CpuLaneResource(LaneEndpoint):
    """Batch work for the CPU lane; `embedded` finds or starts the bundled llama-server.

    Its settings are the config models themselves (configs/lanes.yaml), nested: `config` the lane,
    `bandwidth` how it yields, `gpu` the GPU lane it yields to (`embedded` watches the embedded one when it
    runs, and never starts one for this). Nothing here declares a setting or its default again."""

    lane: ClassVar[LaneName] = "cpu"

    config: CpuLane = CpuLane()
    bandwidth: BandwidthConfig = BandwidthConfig()
    gpu: GpuLane = GpuLane()

    @classmethod
    def from_lanes(cls, lanes: LanesConfig, base_url: str | None = None) -> CpuLaneResource:
        """The resource of a lanes.yaml; `base_url` overrides the configured one: the URL of a server
        `running_lanes` already resolved (with `endpoints`, that is the first one's: they stay)."""
        config = lanes.cpu_lane
        if base_url is not None and base_url != config.base_url:
            config = config.model_copy(update={"base_url": base_url, "endpoints": None})
        return cls(config=config, bandwidth=lanes.bandwidth, gpu=lanes.gpu_lane)

    def connection(self) -> CpuLane:
        return self.config

    def cpu_client(self) -> CpuClient:
        return CpuClient(
            self.url,
            self.api_key(),
            timeout_s=self.config.request_timeout_s,
            connect_timeout_s=self.config.connect_timeout_s,
            retry=self.retry_policy(),
        )

    def endpoint_clients(self) -> list[CpuEndpointClient]:
        """A client per server of the lane (`endpoints`, or the one base_url, resolved), with its slots."""
        if not self.config.endpoints:
            return [CpuEndpointClient(self.cpu_client(), self.config.max_slots)]
        return [
            CpuEndpointClient(
                CpuClient(
                    endpoint.base_url,
                    os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None,
                    timeout_s=self.config.request_timeout_s,
                    connect_timeout_s=self.config.connect_timeout_s,
                    retry=self.retry_policy(),
                ),
                endpoint.slots,
            )
            for endpoint in self.config.endpoint_list()
        ]

    def resolved_cache_path(self) -> Path:
        return Path(self.config.cache_path) if self.config.cache_path else default_cache_path()

    def batch_config(self) -> BatchConfig:
        return BatchConfig.of(self.config, lease_dir=data_dir() / "run" / "cpu-lane-slots")

    def gpu_metrics_url(self) -> str | None:
        """The GPU lane to yield to, without starting one: None when off or when no embedded one runs."""
        if not self.bandwidth.yield_to_gpu:
            return None
        if not self.gpu.is_embedded:
            return self.gpu.base_url
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

        gpu_api_key = os.environ.get(self.gpu.api_key_env) if self.gpu.api_key_env else None
        with (
            ExitStack() as clients,
            ResponseCache(self.resolved_cache_path()) as cache,
            yielding_to_gpu(self.gpu_metrics_url(), self.bandwidth, gpu_api_key, on_yield) as governor,
        ):
            endpoints = self.endpoint_clients()
            for endpoint in endpoints:
                clients.enter_context(endpoint.client)
            cap = governor.cap if governor is not None else None
            result = BatchRunner(endpoints, cache, self.batch_config(), cap=cap).run(requests, report)
            if governor is not None:
                result.bandwidth = governor.report()
        if log is not None:
            s = result.summary
            log.info(
                f"CPU lane {label}: {s.ok}/{s.items} ok ({s.cache_hits} from cache, {s.answered} answered), "
                f"{s.failed} failed; {s.generation_tokens_per_s:.1f} gen tok/s, prefix reuse "
                f"{_percent(s.prefix_cache_reuse)}"
            )
            if len(result.endpoints) > 1:
                log.info(f"CPU lane {label}: endpoints: {endpoints_line(result)}")
        return result


def over_failure_ratio(failed: int, total: int, allowed: float) -> bool:
    """The one failure gate: more than `allowed` (cpu_lane.max_failure_ratio) of `total` failed."""
    return total > 0 and failed / total > allowed


def fail_on_transient_failures(
    asset: str, failed: Sequence[ItemResult], asked: int, allowed: float, metadata: dict[str, Any]
) -> None:
    """The failure gate every CPU-lane asset applies: raise a Dagster Failure when more than `allowed` of
    the `asked` requests failed transiently. What was answered stays remembered, so a re-run asks only for
    the rest; the failures, each with its reason, go with it."""
    if over_failure_ratio(len(failed), asked, allowed):
        raise Failure(
            description=f"{asset}: {len(failed)} of {asked} requests failed for transient reasons "
            f"(> {allowed:.0%}); the answers so far are remembered, a re-run asks only for the rest",
            metadata={**metadata, "cpu_lane/failures": failures_table(failed)},
        )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def servers_metadata(batches: Sequence[BatchResult]) -> dict[str, Any]:
    """What the lane's servers were and did in a materialization's batches, beside the counts: the server,
    its slots and per-slot context (the last batch's), the endpoints when there are several (answered, down,
    why), whether slot copies were off and why, and how far the lane yielded to the GPU lane."""
    served = [batch for batch in batches if batch.server is not None]
    if not served:
        return {}
    last = served[-1]
    metadata: dict[str, Any] = {
        "cpu_lane/server": f"{last.server.server} at {last.server.url}",
        "cpu_lane/slots": last.server.total_slots,
        "cpu_lane/per_slot_ctx": last.server.per_slot_ctx,
    }
    several = [batch for batch in served if len(batch.endpoints) > 1]
    if several:
        endpoints = several[-1].endpoints
        metadata["cpu_lane/slots"] = sum(e.slots for e in endpoints)
        metadata["cpu_lane/endpoints_down"] = sum(e.down for e in endpoints)
        for index, endpoint in enumerate(endpoints):
            metadata[f"cpu_lane/endpoint_{index}_answered"] = endpoint.answered
        metadata["cpu_lane/endpoints"] = endpoints_table(several[-1])
    copy_off = next((e.slot_copy_off for batch in served for e in batch.endpoints if e.slot_copy_off), None)
    if copy_off is not None:
        metadata["cpu_lane/slot_copy_off"] = copy_off
    reports = [batch.bandwidth for batch in served if batch.bandwidth is not None]
    if reports:
        metadata["cpu_lane/gpu_yields"] = sum(r.yields for r in reports)
        metadata["cpu_lane/gpu_yielded_s"] = round(sum(r.yielded_s for r in reports), 3)
        metadata["cpu_lane/gpu_max_running"] = max(r.max_gpu_running for r in reports)
    return metadata


def endpoints_line(result: BatchResult) -> str:
    """Per endpoint: items answered, and whether (and why) it went down."""
    return "; ".join(
        f"{e.url} answered {e.answered}" + (f", DOWN ({e.requeued} re-queued): {e.reason}" if e.down else "")
        for e in result.endpoints
    )


def endpoints_table(result: BatchResult) -> MetadataValue:
    """The batch's endpoints as a Markdown table: slots, answered, re-queued, down and why."""
    rows = ["| endpoint | slots | answered | re-queued | down | reason |", "|---|---|---|---|---|---|"]
    for e in result.endpoints:
        reason = (e.reason or "").replace("|", "\\|").replace("\n", " ")[:300]
        down = "yes" if e.down else "no"
        rows.append(f"| {e.url} | {e.slots} | {e.answered} | {e.requeued} | {down} | {reason} |")
    return MetadataValue.md("\n".join(rows))


def failures_table(failed: Sequence[ItemResult]) -> MetadataValue:
    """Failed items as a Markdown table: item, kind, reason (the first 50)."""
    rows = ["| item | kind | reason |", "|---|---|---|"]
    for item in failed[:50]:
        reason = (item.failure.reason if item.failure else "").replace("|", "\\|").replace("\n", " ")[:300]
        rows.append(f"| {item.id} | {item.failure.kind if item.failure else ''} | {reason} |")
    if len(failed) > 50:
        rows.append(f"| ... | | {len(failed) - 50} more |")
    return MetadataValue.md("\n".join(rows))
