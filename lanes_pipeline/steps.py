"""What wraps every asset step: `asset_step` goes under `@asset(...)`.

- The host's CPU and memory over the step, as Dagster metadata (`host/...`), plotted over the days beside
  each asset's own figures, so a step that slows because the two lanes fight over the machine shows why.
  The figures come from psutil: system-wide CPU utilization and memory over the step (sampled in a
  thread), and the peak RSS of the step's process and of the subprocesses it waited for (the trainer, the
  sandbox); they are added to each MaterializeResult the function returns or yields.
- The guard that decides whether a failed step may be retried: a stop signal (SIGTERM, Ctrl-C) or a
  deterministic error fails it for good; only transient lane errors meet the retry policy.
"""

from __future__ import annotations

import functools
import inspect
import resource
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psutil
from dagster import DagsterExecutionInterruptedError, Failure, MaterializeResult, RetryRequested

from lanes_pipeline.errors import is_transient_error

SAMPLE_S = 1.0
INTERRUPTS = (KeyboardInterrupt, DagsterExecutionInterruptedError)
F = TypeVar("F", bound=Callable[..., Any])


class HostSampler:
    """psutil readings every SAMPLE_S seconds in a thread, from start() to stop()."""

    def __init__(self, interval_s: float = SAMPLE_S) -> None:
        self.interval_s = interval_s
        self.cpu: list[float] = []
        self.memory_percent: list[float] = []
        self.available_gb: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
        self._started = 0.0
        self._cpu_times_start: Any = None

    def _sample(self) -> None:
        memory = psutil.virtual_memory()
        self.memory_percent.append(memory.percent)
        self.available_gb.append(memory.available / 2**30)

    def _run(self) -> None:
        psutil.cpu_percent(interval=None)  # primes the per-call CPU counter
        while not self._stop.wait(self.interval_s):
            self.cpu.append(psutil.cpu_percent(interval=None))
            self._sample()

    def start(self) -> HostSampler:
        self._started = time.monotonic()
        self._cpu_times_start = psutil.cpu_times()
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> dict[str, float | int]:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        return self.figures()

    def figures(self) -> dict[str, float | int]:
        # The mean over the whole step from the kernel's counters (exact even for a step shorter than one
        # sample); the samples give the peak.
        end = psutil.cpu_times()
        busy = sum(end) - end.idle - (sum(self._cpu_times_start) - self._cpu_times_start.idle)
        total = sum(end) - sum(self._cpu_times_start)
        mean_cpu = 100.0 * busy / total if total > 0 else 0.0
        self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
        children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {
            "host/cpu_percent_mean": round(mean_cpu, 1),
            "host/cpu_percent_max": round(max(self.cpu, default=mean_cpu), 1),
            "host/cpu_count": psutil.cpu_count() or 0,
            "host/memory_percent_max": round(max(self.memory_percent), 1),
            "host/memory_available_gb_min": round(min(self.available_gb), 2),
            "host/process_peak_rss_mb": round(self_peak, 1),
            "host/children_peak_rss_mb": round(children_peak, 1),
            "host/step_wall_s": round(time.monotonic() - self._started, 3),
        }


def _with(result: Any, figures: dict[str, float | int]) -> Any:
    if not isinstance(result, MaterializeResult):
        return result
    return MaterializeResult(
        asset_key=result.asset_key,
        metadata={**(result.metadata or {}), **figures},
        check_results=result.check_results,
        data_version=result.data_version,
        tags=result.tags,
    )


# Set when a stop arrives: SIGTERM or SIGHUP to `lanes run` / `lanes serve` (cli/stopping.py), or an
# interrupt raised inside a step (`stopped_step`). A step that starts after it refuses to run, for good, so
# the run ends instead of going on.
STOP_REQUESTED = threading.Event()


def refuse_after_stop() -> None:
    if STOP_REQUESTED.is_set():
        raise Failure("the command was asked to stop (SIGTERM or SIGHUP): step not run", allow_retries=False)


def stopped_step(interrupt: BaseException) -> Failure:
    """What a step interrupted by Ctrl-C or SIGTERM raises instead. Dagster raises the interrupt inside the
    step (it maps SIGTERM to its SIGINT handler while it executes) and, when the step has a retry policy,
    retries it after the policy's delay, so the run went on (SIGTERM) or ended only after that wait (SIGHUP).
    A Failure that allows no retry ends the step now, and the steps after it refuse to run."""
    STOP_REQUESTED.set()
    return Failure(
        f"the step was interrupted ({type(interrupt).__name__}): stopped, not retried", allow_retries=False
    )


def failed_for_good(exc: Exception) -> Failure:
    """What a step that raised a deterministic error (errors.is_transient_error) raises instead: a Failure
    that skips the step's retry policy, naming the error and, from its notes (errors.about), the item that
    caused it. The same inputs raise it again, so retrying with backoff only delays the day's failure."""
    notes = "".join(f"\n{note}" for note in getattr(exc, "__notes__", []))
    return Failure(
        f"{type(exc).__name__}: {exc}{notes}\n(not retried: the same inputs raise it again)",
        allow_retries=False,
    )


def _reraise(exc: Exception) -> None:
    if isinstance(exc, Failure | RetryRequested) or is_transient_error(exc):
        raise exc
    raise failed_for_good(exc) from exc


def asset_step(fn: F) -> F:
    """Add `host/...` figures of the step to the asset's MaterializeResult(s); signature kept for Dagster.
    A step that starts after a stop signal does not run (`refuse_after_stop`), one interrupted while it
    runs is stopped, not retried (`stopped_step`), and one that raised a deterministic error fails at once
    (`failed_for_good`): only a transient lane error is left to the step's retry policy."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            refuse_after_stop()
            sampler = HostSampler().start()
            try:
                for item in fn(*args, **kwargs):
                    yield _with(item, sampler.figures()) if isinstance(item, MaterializeResult) else item
            except INTERRUPTS as interrupt:
                raise stopped_step(interrupt) from interrupt
            except Exception as exc:
                _reraise(exc)
            finally:
                sampler.stop()

        return generator  # type: ignore[return-value]

    @functools.wraps(fn)
    def function(*args: Any, **kwargs: Any) -> Any:
        refuse_after_stop()
        sampler = HostSampler().start()
        try:
            result = fn(*args, **kwargs)
        except INTERRUPTS as interrupt:
            raise stopped_step(interrupt) from interrupt
        except Exception as exc:
            _reraise(exc)
            raise  # unreachable: _reraise always raises
        finally:
            figures = sampler.stop()
        return _with(result, figures)

    return function  # type: ignore[return-value]
