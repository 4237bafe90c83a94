"""What the stop tests check: a command's whole process tree, and that nothing of it outlives the command."""

from __future__ import annotations

import socket
import time

import psutil


def family(pid: int) -> dict[int, str]:
    """pid -> command line of the process and every descendant (also those in other sessions)."""
    found: dict[int, str] = {}
    try:
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                found[process.pid] = " ".join(process.cmdline()[:4])
            except psutil.Error:
                continue
    except psutil.NoSuchProcess:
        pass
    return found


def survivors(pids: dict[int, str], within_s: float = 15.0) -> dict[int, str]:
    """The processes of `pids` still running (zombies count as gone) after up to `within_s` seconds."""

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + within_s
    while True:
        left = {pid: cmd for pid, cmd in pids.items() if alive(pid)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def port_is_free(port: int) -> bool:
    """Nobody listens on it: a server could bind it now (SO_REUSEADDR, as servers bind, so the closed
    connections' TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
