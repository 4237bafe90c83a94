"""The bound on in-flight completion requests of the CPU lane, within a process and across processes."""

from __future__ import annotations

import fcntl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


class CapAdmission:
    """The bandwidth governor's cap on completion requests in flight, counted over every gate that shares
    it: with several endpoints, the cap bounds their total, not each one's.

    `cap` is asked before each admission and may lower the bound for a while (None means no cap):
    requests in flight finish, new ones wait until fewer than the cap are in flight."""

    def __init__(self, cap: Callable[[], int | None] | None = None, poll_s: float = 0.05) -> None:
        self.cap, self.poll_s = cap, poll_s
        self._lock = threading.Lock()
        self._admitted = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        while True:
            cap = self.cap() if self.cap is not None else None
            with self._lock:  # the check and the count under one lock: two threads cannot both slip in
                if cap is None or self._admitted < max(1, cap):
                    self._admitted += 1
                    break
            time.sleep(self.poll_s)
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1


class SlotGate:
    """At most `limit` completion requests in flight: across this process's threads (a semaphore) and,
    with `lease_dir`, across processes (one lock file per slot: a CLI batch beside a Dagster run shares
    the slots instead of doubling them). flock leases die with their process, so a crash frees them.

    `cap`, when given, is asked before each admission and may lower the bound for a while (the bandwidth
    governor's minimum while the GPU lane is busy; None means no cap): requests in flight finish, new ones
    wait until fewer than the cap are in flight. `admission` instead shares one such cap among several
    gates (one per endpoint)."""

    def __init__(
        self,
        limit: int,
        lease_dir: Path | None = None,
        poll_s: float = 0.05,
        cap: Callable[[], int | None] | None = None,
        admission: CapAdmission | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("a slot gate needs at least one slot")
        if cap is not None and admission is not None:
            raise ValueError("a slot gate takes its own cap or a shared admission, not both")
        self.limit, self.lease_dir, self.poll_s, self.cap = limit, lease_dir, poll_s, cap
        self.admission = admission if admission is not None else CapAdmission(cap, poll_s)
        self._semaphore = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        if lease_dir is not None:
            lease_dir.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def hold(self) -> Iterator[None]:
        # The cap is counted before the lease, so a waiting thread holds no cross-process slot.
        with self._semaphore, self.admission.admit():
            lease = self._lease() if self.lease_dir is not None else None
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                yield
            finally:
                with self._lock:
                    self.in_flight -= 1
                if lease is not None:
                    fcntl.flock(lease, fcntl.LOCK_UN)
                    lease.close()

    def _lease(self) -> IO[str]:
        assert self.lease_dir is not None
        while True:
            for slot in range(self.limit):
                handle = (self.lease_dir / f"slot-{slot}.lock").open("a")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return handle
                except BlockingIOError:
                    handle.close()
            time.sleep(self.poll_s)  # another process holds every slot
