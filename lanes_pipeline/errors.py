"""Errors a lane can raise, each naming the lane, the URL or file, and what to do about it."""

from __future__ import annotations

from pathlib import Path


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(0, handle.tell() - 16_384))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class LaneError(RuntimeError):
    """Base of every lane failure."""


class LaneUnreachableError(LaneError):
    def __init__(self, lane: str, url: str, tried: str, cause: str) -> None:
        self.lane, self.url, self.tried = lane, url, tried
        super().__init__(
            f"{lane} lane at {url} is unreachable: {tried} failed: {cause}. "
            f"Start the server, or set {lane.lower()}_lane.base_url in configs/lanes.yaml "
            f"(or 'embedded' for the bundled one)."
        )


class LaneNotReadyError(LaneError):
    def __init__(self, lane: str, url: str, waited_s: float, last: str) -> None:
        super().__init__(f"{lane} lane at {url} was not ready after {waited_s:.0f} s (last answer: {last})")


class EmbeddedStartError(LaneError):
    """An embedded engine failed to install or start: says where the full log is, and shows its end."""

    def __init__(self, message: str, log_path: Path | None, tail: str) -> None:
        self.log_path, self.tail = log_path, tail
        where = f"\nfull log: {log_path}" if log_path else ""
        shown = f"\n--- last lines ---\n{tail}" if tail else ""
        super().__init__(f"{message}{where}{shown}")


class PortInUseError(LaneError):
    def __init__(self, lane: str, port: int, owner: str | None) -> None:
        by = f" by {owner}" if owner else ""
        super().__init__(
            f"port {port} for the embedded {lane} lane is already in use{by}; stop that process or set "
            f"{lane.lower()}_lane.embedded.port in configs/lanes.yaml (0 picks a free port)"
        )
